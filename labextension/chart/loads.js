// The load panels: the machine's load over the run, beside the logged curves (kernel side:
// nbtrain/dashboard/load_feed.py). Each update of the ``load`` trait carries only the telemetry samples that are
// new; they are appended here. Past MAX_POINTS samples every other one is dropped, all along the run (the
// curves keep their shape, at half the resolution), so a long run's memory stays flat. Each device's colour, dash
// and width come with its samples (``styles``: theme.device_style in Python), the final figure's own.
import uPlot from "uplot";
import { floats } from "./data.js";

export const MAX_POINTS = 3600;

function thinned(values) {
  return values.filter((_, i) => i % 2 === 0);
}

function percentText(u, v) {
  return v == null || Number.isNaN(v) ? "–" : v.toFixed(0) + "%";
}

export class LoadPanels {
  constructor(parent, width, height, onDraw) {
    this.parent = parent;
    this.options = { width, height };
    this.onDraw = onDraw;
    this.t = [];
    this.devices = [];
    this.columns = { busy: {}, memory: {} };
    this.titles = null;
    this.styles = {};
    this.plots = [];
    this.zoomed = false;
  }

  // Append one update's samples (NaN = not known: drawn as a gap).
  append(load) {
    if (!load || !load.t) return;
    const t = Array.from(floats(load.t));
    const start = this.t.length;
    this.t.push(...t);
    for (const device of load.devices) {
      for (const key of ["busy", "memory"]) {
        const column = this.columns[key][device] || (this.columns[key][device] = new Array(start).fill(null));
        for (const v of floats(load[key][device])) column.push(Number.isNaN(v) ? null : v);
      }
    }
    for (const key of ["busy", "memory"]) { // a device absent from this update: gaps, so columns stay aligned
      for (const column of Object.values(this.columns[key])) while (column.length < this.t.length) column.push(null);
    }
    if (this.t.length > MAX_POINTS) {
      this.t = thinned(this.t);
      for (const key of ["busy", "memory"]) {
        for (const device of Object.keys(this.columns[key])) this.columns[key][device] = thinned(this.columns[key][device]);
      }
    }
    const devices = Object.keys(this.columns.busy);
    const rebuild = !this.titles || this.titles.join() !== load.titles.join() || devices.join() !== this.devices.join();
    this.devices = devices;
    this.titles = load.titles;
    Object.assign(this.styles, load.styles);
    if (rebuild) this.build();
    else this.draw();
  }

  get points() {
    return this.t.length;
  }

  build() {
    this.destroy();
    const { width, height } = this.options;
    this.plots = ["busy", "memory"].map((key, k) => {
      const series = [{ label: "seconds", value: (u, v) => (v == null ? "–" : v.toFixed(0) + " s") }];
      for (const device of this.devices) {
        const style = this.styles[device];
        series.push({ label: device, stroke: style.color, width: style.width, dash: style.dash, spanGaps: false,
                      value: percentText });
      }
      const cell = document.createElement("div");
      cell.className = "nbt-load-" + key;
      this.parent.appendChild(cell);
      const panel = this;
      return new uPlot({
        title: this.titles[k], width, height, series,
        scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(100, max || 0)] } },
        axes: [{ label: "seconds since the first sample" }, { size: 50 }],
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

  data(key) {
    return [this.t, ...this.devices.map((device) => this.columns[key][device])];
  }

  draw() {
    this.plots.forEach((plot, k) => plot.setData(this.data(k === 0 ? "busy" : "memory"), !this.zoomed));
  }

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
