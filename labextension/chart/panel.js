// @ts-check
// One uPlot chart: a panel of the dashboard, for a training value and its validation twin.
// Per name four uPlot series: the buckets' min and max (drawn as a band, no line), the raw mean (light) and
// the smoothed mean (bold). Series logged at different steps share the x axis through uPlot.join.
// Then one series per earlier run of the kernel that logged one of the panel's names (``overlays``): its mean,
// smoothed as this run's, faded and dashed, labelled with what differed; runs that differed alike share one legend
// row ("loss · runs 1, 2: the same cell and options"); a click on a row hides its runs (``options.hidden`` keeps
// that across rebuilds: log scale, wall time).
// Colours, widths and which series are smoothed come from the kernel (the ``chart_style`` trait, theme.chart_style in
// Python), the final figure's own: this file holds none.
import uPlot from "uplot";
import { smooth, allPositive, worthSmoothing, overlayGroups, overlayKey, overlayLabel } from "./data.js";

const PER_NAME = 4; // min, max, raw, smoothed

/** What the kernel draws with (theme.chart_style in Python), the final figure's own.
 * @typedef {import("./data.js").SmoothRule & {series_colors: string[], raw_alpha: number, raw_width: number,
 *           curve_width: number, band_alpha: number, overlay_alpha: number, overlay_dash: number[]}} ChartStyle */
/** How a panel draws: scale, x, size, style, and the overlay labels the user hid (kept across rebuilds).
 * @typedef {{log: boolean, xKey: string, width: number, height: number, style: ChartStyle,
 *            hidden?: Set<string>}} PanelOptions */
/** An earlier run's series drawn in a panel, after the panel's own names; runs that differed from this one in the
 * same way share a label and one legend row (the group's first run's).
 * @typedef {{run: number, name: string, label: string, first: boolean}} Overlay */

/** @param {string} color "#rrggbb" @param {number} a @returns {string} */
function alpha(color, a) {
  const n = parseInt(color.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

/** @param {number | null | undefined} v @returns {string} */
function shortNumber(v) {
  if (v == null || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : +v.toPrecision(5) + "";
}

/** @param {uPlot} u @param {number | null} v @returns {string} */
const valueText = (u, v) => shortNumber(v);

export class Panel {
  /** @param {HTMLElement} parent @param {string} title @param {string[]} names @param {PanelOptions} options
   * @param {(panel: Panel, u: uPlot) => void} onDraw */
  constructor(parent, title, names, options, onDraw) {
    this.parent = parent;
    this.title = title;
    this.names = names;
    this.options = options; // {log, xKey, width, height, style, hidden: Set of overlay labels the user hid}
    /** @type {Overlay[]} the earlier runs' series drawn here, after the names' own */
    this.overlays = [];
    this.onDraw = onDraw;
    this.zoomed = false;
    /** @type {uPlot | null} */
    this.plot = null;
    /** @type {number | null} */
    this.distrKey = null;
    /** @type {uPlot.AlignedData | null} */
    this.columns = null;
    this.points = 0; // buckets drawn by the last draw
    this.smoothGap = 0; // how far the smoothed curves are from the raw ones, summed
    this.drawStarted = 0;
  }

  /** @param {number} distr uPlot's y distribution: 1 linear, 3 log, 4 asinh */
  build(distr) {
    if (this.plot) this.plot.destroy();
    const { xKey, width, height, style } = this.options;
    /** @type {uPlot.Series[]} */
    const series = [{ label: xKey === "time" ? "seconds" : "step", value: valueText }];
    /** @type {uPlot.Band[]} */
    const bands = [];
    this.names.forEach((name, i) => {
      const color = style.series_colors[i % style.series_colors.length];
      const at = 1 + i * PER_NAME;
      series.push({ label: `${name} min`, stroke: "transparent", width: 0, points: { show: false }, spanGaps: true });
      series.push({ label: `${name} max`, stroke: "transparent", width: 0, points: { show: false }, spanGaps: true });
      series.push({ label: `${name} raw`, stroke: alpha(color, style.raw_alpha), width: style.raw_width, spanGaps: true,
                    value: valueText });
      series.push({ label: name, stroke: color, width: style.curve_width, spanGaps: true, value: valueText });
      bands.push({ series: [at + 1, at], fill: alpha(color, style.band_alpha) });
    });
    const hidden = this.options.hidden || new Set();
    for (const { name, label } of this.overlays) {
      const color = style.series_colors[this.names.indexOf(name) % style.series_colors.length];
      series.push({ label, stroke: alpha(color, style.overlay_alpha), width: style.curve_width, dash: style.overlay_dash,
                    spanGaps: true, show: !hidden.has(label), value: valueText });
    }
    /** @type {uPlot.Scale} */
    const y = distr === 1 ? { distr: 1 } : distr === 3 ? { distr: 3, log: 10 } : { distr: 4, asinh: 1e-3 };
    const panel = this;
    this.plot = new uPlot({
      title: this.title, width, height, series, bands,
      scales: { x: { time: false }, y },
      axes: [{ label: xKey === "time" ? "seconds since the first value" : "step" }, { size: 60 }],
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
      hooks: {
        setSelect: [(u) => { if (u.select.width > 0) panel.zoomed = true; }],
        draw: [(u) => panel.onDraw(panel, u)],
        setSeries: [(u, i) => panel.toggled(u, i)],
      },
    }, this.columns || [[]], this.parent);
    // Only the raw and smoothed means get a legend row: the band's edges are read from the hover anyway.
    const own = 1 + this.names.length * PER_NAME;
    this.plot.root.querySelectorAll(".u-legend .u-series").forEach((element, i) => {
      const row = /** @type {HTMLElement} */ (element);
      if (i > 0 && i < own && (i - 1) % PER_NAME < 2) row.style.display = "none";
      if (i >= own) row.classList.add("nbt-overlay");
      if (i >= own && !this.overlays[i - own].first) row.style.display = "none"; // its group's first row stands for it
    });
    this.plot.over.addEventListener("dblclick", () => { panel.zoomed = false; });
    this.distrKey = distr;
  }

  /** An overlay's legend row was clicked: remember whether it is hidden, for the next rebuild.
   * @param {uPlot} u @param {number | null} i */
  toggled(u, i) {
    if (i == null) return;
    const at = i - 1 - this.names.length * PER_NAME;
    if (at < 0 || !this.options.hidden) return;
    const { label } = this.overlays[at];
    const show = Boolean(u.series[i].show);
    if (show) this.options.hidden.delete(label);
    else this.options.hidden.add(label);
    this.overlays.forEach((overlay, j) => { // the rest of its group follows its legend row
      const index = 1 + this.names.length * PER_NAME + j;
      if (overlay.label === label && Boolean(u.series[index].show) !== show) u.setSeries(index, { show });
    });
    this.onDraw(this, u);
  }

  /** [shown, drawn]: how many earlier runs' series this panel draws, and how many of them are not hidden.
   * @returns {[number, number]} */
  overlayCounts() {
    if (!this.plot) return [0, 0];
    const drawn = this.plot.series.slice(1 + this.names.length * PER_NAME);
    return [drawn.filter((s) => s.show).length, drawn.length];
  }

  /** The earlier runs' tables (x, mean smoothed as this run's) of the names this panel draws.
   * @param {import("./data.js").OverlayRun[] | undefined} runs @param {number} weight @param {number} mostPoints
   * @returns {uPlot.AlignedData[]} */
  overlayTables(runs, weight, mostPoints) {
    const { xKey, style } = this.options;
    /** @type {uPlot.AlignedData[]} */
    const tables = [];
    this.overlays = [];
    const groups = overlayGroups(runs || [], this.names);
    for (const run of runs || []) {
      for (const name of this.names) {
        const cols = run.series[name];
        if (!cols || !cols.mean.length) continue;
        const t0 = cols.time[0];
        const xs = xKey === "time" ? Array.from(cols.time, (t) => t - t0) : Array.from(cols.step);
        const ys = worthSmoothing(cols.mean.length, mostPoints, style) ? smooth(cols.mean, weight) : Array.from(cols.mean);
        tables.push([xs, ys]);
        const members = groups.get(overlayKey(name, run.label)) || [run.number];
        this.overlays.push({ run: run.number, name, label: overlayLabel(name, members, run.label),
                             first: members[0] === run.number });
      }
    }
    return tables;
  }

  /** Redraw from ``series`` (data.joinSeries), smoothed with ``weight`` where the series is dense enough beside the
   * longest one drawn (``mostPoints`` buckets), with the earlier ``runs`` (data.overlayRuns) beside it; rebuilds
   * the chart if the scale or the overlays changed.
   * @param {import("./data.js").Series} series @param {number} weight @param {number} t0 @param {number} mostPoints
   * @param {import("./data.js").OverlayRun[]} [runs] */
  draw(series, weight, t0, mostPoints, runs) {
    const { xKey, log, style } = this.options;
    /** @type {uPlot.AlignedData[]} */
    const tables = [];
    this.points = 0;
    this.smoothGap = 0;
    for (const name of this.names) {
      const cols = series[name];
      if (!cols) continue;
      const xs = xKey === "time" ? Array.from(cols.time, (t) => t - t0) : Array.from(cols.step);
      const smoothed = worthSmoothing(cols.mean.length, mostPoints, style) ? smooth(cols.mean, weight) : Array.from(cols.mean);
      for (let i = 0; i < smoothed.length; i++) this.smoothGap += Math.abs(smoothed[i] - cols.mean[i]);
      tables.push([xs, Array.from(cols.min), Array.from(cols.max), Array.from(cols.mean), smoothed]);
      this.points += cols.mean.length;
    }
    if (tables.length !== this.names.length) return; // a name of this panel not sent yet
    const before = this.overlays.map((o) => o.label).join("\n");
    tables.push(...this.overlayTables(runs, weight, mostPoints));
    const overlaysChanged = this.overlays.map((o) => o.label).join("\n") !== before;
    this.columns = tables.length === 1 ? tables[0] : uPlot.join(tables);
    const distr = !log ? 1 : allPositive(series, this.names) ? 3 : 4;
    this.drawStarted = performance.now();
    if (!this.plot || distr !== this.distrKey || overlaysChanged) this.build(distr);
    else this.plot.setData(this.columns, !this.zoomed);
  }

  /** @param {number} width */
  resize(width) {
    this.options.width = width;
    if (this.plot) this.plot.setSize({ width, height: this.options.height });
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
