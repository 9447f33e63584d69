// @ts-check
// The chart's data, apart from drawing: the base and tail the kernel sends (nbtrain/kernel/dashboard/chart_feed.py),
// joined into one set of columns per series, and the smoothing drawn over them. Typed with JSDoc, checked by
// tsc (tsconfig.chart.json); tested by node's own test runner (chart/test/).

/** One series' buckets: a column per key of COLUMNS, all of one length.
 * @typedef {{step: Float64Array, time: Float64Array, mean: Float64Array, min: Float64Array, max: Float64Array}} Columns */
/** @typedef {Record<string, Columns>} Series */
/** A column as it arrives: ipywidgets' binary buffer (a DataView), raw bytes, or floats already.
 * @typedef {DataView | ArrayBuffer | Float64Array | null | undefined} WireColumn */
/** A base or a tail of the ``base`` / ``tail`` traits: its series' columns, the epoch it belongs to, the panels.
 * @typedef {{epoch: number, series: Record<string, Record<string, WireColumn>>, groups?: [string, string[]][]}} Update */
/** The kernel's rule for smoothing (nbtrain.kernel.dashboard.series.worth_smoothing), sent in the ``chart_style`` trait.
 * @typedef {{smooth_min_points: number, smooth_dense_share: number}} SmoothRule */

/** @type {(keyof Columns)[]} */
export const COLUMNS = ["step", "time", "mean", "min", "max"];

/** A column as floats: it arrives as a DataView over little-endian float64 bytes (ipywidgets' binary buffers).
 * @param {WireColumn} view
 * @returns {Float64Array} */
export function floats(view) {
  if (!view) return new Float64Array(0);
  if (view instanceof Float64Array) return view;
  const bytes = ArrayBuffer.isView(view) ? new Uint8Array(view.buffer, view.byteOffset, view.byteLength) : new Uint8Array(view);
  return new Float64Array(bytes.slice().buffer); // a copy: aligned, and ours to keep
}

/** @param {Float64Array} a @param {Float64Array} b @returns {Float64Array} */
function concat(a, b) {
  if (!a.length) return b;
  if (!b.length) return a;
  const out = new Float64Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/** {name: {step, time, mean, min, max}}: the base's buckets then the tail's, when both are of one epoch.
 * @param {Update | null | undefined} base
 * @param {Update | null | undefined} tail
 * @returns {Series} */
export function joinSeries(base, tail) {
  /** @type {Series} */
  const out = {};
  if (!tail || !tail.series) return out;
  const head = base && base.epoch === tail.epoch && base.series ? base.series : {};
  for (const [name, cols] of Object.entries(tail.series)) {
    const before = head[name];
    const joined = /** @type {Columns} */ ({});
    for (const key of COLUMNS) joined[key] = concat(before ? floats(before[key]) : new Float64Array(0), floats(cols[key]));
    out[name] = joined;
  }
  return out;
}

/** Exponential moving average with the start-up bias removed, as nbtrain.kernel.dashboard.series.smooth (TensorBoard).
 * @param {ArrayLike<number>} values
 * @param {number} weight 0 (none) to below 1
 * @returns {number[]} */
export function smooth(values, weight) {
  if (!(weight > 0)) return Array.from(values);
  /** @type {number[]} */
  const out = new Array(values.length);
  let last = 0, debias = 1;
  for (let i = 0; i < values.length; i++) {
    last = last * weight + (1 - weight) * values[i];
    debias *= weight;
    out[i] = last / (1 - debias);
  }
  return out;
}

/** Whether a series of ``points`` buckets is smoothed beside a longest one of ``mostPoints``: the kernel's rule
 * (nbtrain.kernel.dashboard.series.worth_smoothing), its numbers sent in the ``chart_style`` trait.
 * @param {number} points @param {number} mostPoints @param {SmoothRule} style @returns {boolean} */
export function worthSmoothing(points, mostPoints, style) {
  return points > style.smooth_min_points && points >= mostPoints * style.smooth_dense_share;
}

/** The most buckets of any series in ``names`` (the panels drawn).
 * @param {Series} series @param {string[]} names @returns {number} */
export function mostPoints(series, names) {
  return Math.max(0, ...names.map((name) => (series[name] ? series[name].mean.length : 0)));
}

/** The earliest wall time of any series (0 when none has a point): where the time axis starts.
 * @param {Series} series @returns {number} */
export function firstTime(series) {
  let t0 = Infinity;
  for (const cols of Object.values(series)) if (cols.time.length) t0 = Math.min(t0, cols.time[0]);
  return Number.isFinite(t0) ? t0 : 0;
}

/** Whether every bucket of ``names`` is above 0, so a log scale can show them (else asinh).
 * @param {Series} series @param {string[]} names @returns {boolean} */
export function allPositive(series, names) {
  return names.every((name) => !series[name] || series[name].min.every((v) => v > 0));
}

/** An earlier run of the kernel, drawn beside this one: rank 0's reduced series and what differed.
 * @typedef {{number: number, label: string, series: Record<string, {step: Float64Array, time: Float64Array, mean: Float64Array}>}} OverlayRun */

/** The earlier runs the kernel sent once (nbtrain/kernel/dashboard/chart_feed.py overlays_of), their columns as floats.
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

/** The key of an earlier run's series in a panel: its name and what differed from this run.
 * @param {string} name @param {string} label @returns {string} */
export function overlayKey(name, label) {
  return name + "\n" + label;
}

/** Earlier runs that logged a name and differed from this run alike, grouped: key (overlayKey) -> run numbers.
 * @param {OverlayRun[]} runs @param {string[]} names @returns {Map<string, number[]>} */
export function overlayGroups(runs, names) {
  /** @type {Map<string, number[]>} */
  const groups = new Map();
  for (const run of runs) {
    for (const name of names) {
      const cols = run.series[name];
      if (!cols || !cols.mean.length) continue;
      const key = overlayKey(name, run.label);
      groups.set(key, [...(groups.get(key) || []), run.number]);
    }
  }
  return groups;
}

/** A group's legend row: "loss · run 2: --amp off", "loss · runs 1, 2, 3: the same cell and options".
 * @param {string} name @param {number[]} numbers @param {string} label @returns {string} */
export function overlayLabel(name, numbers, label) {
  return `${name} · ${numbers.length === 1 ? "run" : "runs"} ${numbers.join(", ")}: ${label}`;
}
