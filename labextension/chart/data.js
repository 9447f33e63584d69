// The chart's data, apart from drawing: the base and tail the kernel sends (nbtrain/dashboard/chart_feed.py),
// joined into one set of columns per series, and the smoothing drawn over them.

export const COLUMNS = ["step", "time", "mean", "min", "max"];

// A column arrives as a DataView over little-endian float64 bytes (ipywidgets' binary buffers).
export function floats(view) {
  if (!view) return new Float64Array(0);
  if (view instanceof Float64Array) return view;
  const bytes = view.buffer ? new Uint8Array(view.buffer, view.byteOffset, view.byteLength) : new Uint8Array(view);
  return new Float64Array(bytes.slice().buffer); // a copy: aligned, and ours to keep
}

function concat(a, b) {
  if (!a.length) return b;
  if (!b.length) return a;
  const out = new Float64Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

// {name: {step, time, mean, min, max}}: the base's buckets then the tail's, when both are of one epoch.
export function joinSeries(base, tail) {
  const out = {};
  if (!tail || !tail.series) return out;
  const sameEpoch = base && base.epoch === tail.epoch;
  for (const [name, cols] of Object.entries(tail.series)) {
    const head = sameEpoch && base.series ? base.series[name] : undefined;
    out[name] = {};
    for (const key of COLUMNS) {
      out[name][key] = concat(head ? floats(head[key]) : new Float64Array(0), floats(cols[key]));
    }
  }
  return out;
}

// Exponential moving average with the start-up bias removed, as nbtrain.dashboard.series.smooth (TensorBoard).
export function smooth(values, weight) {
  if (!(weight > 0)) return Array.from(values);
  const out = new Array(values.length);
  let last = 0, debias = 1;
  for (let i = 0; i < values.length; i++) {
    last = last * weight + (1 - weight) * values[i];
    debias *= weight;
    out[i] = last / (1 - debias);
  }
  return out;
}

// Whether a series of ``points`` buckets is smoothed beside a longest one of ``mostPoints``: the kernel's rule
// (nbtrain.dashboard.series.worth_smoothing), its numbers sent in the ``style`` trait.
export function worthSmoothing(points, mostPoints, style) {
  return points > style.smooth_min_points && points >= mostPoints * style.smooth_dense_share;
}

// The most buckets of any series in ``names`` (the panels drawn).
export function mostPoints(series, names) {
  return Math.max(0, ...names.map((name) => (series[name] ? series[name].mean.length : 0)));
}

export function firstTime(series) {
  let t0 = Infinity;
  for (const cols of Object.values(series)) if (cols.time.length) t0 = Math.min(t0, cols.time[0]);
  return Number.isFinite(t0) ? t0 : 0;
}

export function allPositive(series, names) {
  return names.every((name) => !series[name] || series[name].min.every((v) => v > 0));
}

/** An earlier run of the kernel, drawn beside this one: rank 0's reduced series and what differed.
 * @typedef {{number: number, label: string, series: Record<string, {step: Float64Array, time: Float64Array, mean: Float64Array}>}} OverlayRun */

/** The earlier runs the kernel sent once (nbtrain/dashboard/chart_feed.py overlays_of), their columns as floats.
 * @param {{runs?: {number: number, label: string, series?: Record<string, Record<string, any>>}[]} | null | undefined} overlays
 * @returns {OverlayRun[]} */
export function overlayRuns(overlays) {
  if (!overlays || !overlays.runs) return [];
  return overlays.runs.map((run) => {
    /** @type {OverlayRun["series"]} */
    const series = {};
    for (const [name, cols] of Object.entries(run.series || {})) {
      series[name] = { step: floats(cols.step), time: floats(cols.time), mean: floats(cols.mean) };
    }
    return { number: run.number, label: run.label, series };
  });
}
