// @ts-check
// The load panels: the machine's load over the run, beside the logged curves (kernel side:
// nbtrain/kernel/dashboard/load_feed.py). Each update of the ``load`` trait carries only the telemetry samples that are
// new; they are appended here. Past MAX_POINTS samples every other one is dropped, all along the run (the
// curves keep their shape, at half the resolution), so a long run's memory stays flat. Each device's colour, dash
// and width come with its samples (``styles``: theme.device_style in Python), the final figure's own.
import uPlot from "uplot";
import { floats } from "./data.js";

export const MAX_POINTS = 3600;
// The x axis spans at least this many seconds: the first samples of a run sit at its left, not as a lone point
// in the middle of uPlot's default range.
export const MIN_SPAN_S = 10;

/** The x range of the load panels: the samples' times, at least MIN_SPAN_S wide.
 * @param {number | null} min @param {number | null} max @returns {[number, number]} */
export function timeRange(min, max) {
  const start = min ?? 0;
  return [start, Math.max(max ?? start, start + MIN_SPAN_S)];
}

/** @typedef {"busy" | "memory"} LoadKey */
/** A device's line, the final figure's own (theme.device_style in Python).
 * @typedef {{color: string, width: number, dash: number[]}} DeviceStyle */
/** One update of the ``load`` trait: the new samples only, a column per device and key.
 * @typedef {{t: import("./data.js").WireColumn, devices: string[], titles: string[], axis?: string,
 *            busy: Record<string, import("./data.js").WireColumn>, memory: Record<string, import("./data.js").WireColumn>,
 *            styles: Record<string, DeviceStyle>, memory_labels?: Record<string, string>}} LoadUpdate */

/** Every other value, from the first: half the resolution, the same shape.
 * @template T @param {T[]} values @returns {T[]} */
export function thinned(values) {
  return values.filter((_, i) => i % 2 === 0);
}

/** @param {uPlot} u @param {number | null} v @returns {string} */
function percentText(u, v) {
  return v == null || Number.isNaN(v) ? "–" : v.toFixed(0) + "%";
}

export class LoadPanels {
  /** @param {HTMLElement} parent @param {number} width @param {number} height
   * @param {(panels: LoadPanels, u: uPlot) => void} onDraw */
  constructor(parent, width, height, onDraw) {
    this.parent = parent;
    this.options = { width, height };
    this.onDraw = onDraw;
    /** @type {number[]} */
    this.t = [];
    /** @type {string[]} */
    this.devices = [];
    /** @type {Record<LoadKey, Record<string, (number | null)[]>>} */
    this.columns = { busy: {}, memory: {} };
    /** @type {string[] | null} */
    this.titles = null;
    this.axis = "seconds"; // the kernel's label (load_feed.TIME_AXIS) comes with the samples
    /** @type {Record<string, DeviceStyle>} */
    this.styles = {};
    /** @type {Record<string, string>} the memory panel's name of a device where it differs ("RAM (machine)") */
    this.memoryLabels = {};
    /** @type {uPlot[]} */
    this.plots = [];
    this.zoomed = false;
  }

  /** Append one update's samples (NaN = not known: drawn as a gap).
   * @param {LoadUpdate | null | undefined} load */
  append(load) {
    if (!load || !load.t) return;
    const t = Array.from(floats(load.t));
    const start = this.t.length;
    this.t.push(...t);
    /** @type {LoadKey[]} */
    const keys = ["busy", "memory"];
    for (const device of load.devices) {
      for (const key of keys) {
        const column = this.columns[key][device] || (this.columns[key][device] = new Array(start).fill(null));
        for (const v of floats(load[key][device])) column.push(Number.isNaN(v) ? null : v);
      }
    }
    for (const key of keys) { // a device absent from this update: gaps, so columns stay aligned
      for (const column of Object.values(this.columns[key])) while (column.length < this.t.length) column.push(null);
    }
    if (this.t.length > MAX_POINTS) {
      this.t = thinned(this.t);
      for (const key of keys) {
        for (const device of Object.keys(this.columns[key])) this.columns[key][device] = thinned(this.columns[key][device]);
      }
    }
    const devices = Object.keys(this.columns.busy);
    const rebuild = !this.titles || this.titles.join() !== load.titles.join() || devices.join() !== this.devices.join();
    this.devices = devices;
    this.titles = load.titles;
    this.axis = load.axis || this.axis;
    Object.assign(this.styles, load.styles);
    Object.assign(this.memoryLabels, load.memory_labels || {});
    if (rebuild) this.build();
    else this.draw();
  }

  get points() {
    return this.t.length;
  }

  build() {
    this.destroy();
    const { width, height } = this.options;
    const titles = this.titles || [""];
    /** @type {LoadKey[]} */
    const keys = ["busy", "memory"];
    this.plots = keys.map((key, k) => {
      /** @type {uPlot.Series[]} */
      const series = [{ label: "seconds", value: (u, v) => (v == null ? "–" : v.toFixed(0) + " s") }];
      for (const device of this.devices) {
        const style = this.styles[device];
        const label = key === "memory" ? this.memoryLabels[device] || device : device;
        series.push({ label, stroke: style.color, width: style.width, dash: style.dash, spanGaps: false,
                      value: percentText });
      }
      const cell = document.createElement("div");
      cell.className = "nbt-load-" + key;
      this.parent.appendChild(cell);
      const panel = this;
      return new uPlot({
        title: titles[k], width, height, series,
        scales: { x: { time: false, range: (u, min, max) => timeRange(min, max) }, y: { range: (u, min, max) => [0, Math.max(100, max || 0)] } },
        axes: [{ label: this.axis }, { size: 50 }],
        cursor: { drag: { x: true, y: false } },
        legend: { live: true, markers: { dash: (u, i) => (u.series[i].dash?.length ? "dashed" : "solid") } },
        hooks: {
          setSelect: [(u) => { if (u.select.width > 0) panel.zoomed = true; }],
          draw: [(u) => panel.onDraw(panel, u)],
        },
      }, this.data(key), cell);
    });
    for (const plot of this.plots) plot.over.addEventListener("dblclick", () => { this.zoomed = false; });
  }

  /** uPlot's columns of one panel: the times, then each device's values.
   * @param {LoadKey} key @returns {uPlot.AlignedData} */
  data(key) {
    return /** @type {uPlot.AlignedData} */ ([this.t, ...this.devices.map((device) => this.columns[key][device])]);
  }

  draw() {
    this.plots.forEach((plot, k) => plot.setData(this.data(k === 0 ? "busy" : "memory"), !this.zoomed));
  }

  /** @param {number} width */
  resize(width) {
    this.options.width = width;
    for (const plot of this.plots) plot.setSize({ width, height: this.options.height });
  }

  destroy() {
    for (const plot of this.plots) {
      plot.root.parentElement?.remove();
      plot.destroy();
    }
    this.plots = [];
  }
}
