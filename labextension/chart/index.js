// @ts-check
// The dashboard's live chart (an anywidget module; nbtrain/kernel/dashboard/chart.py is its kernel side).
// The kernel only sends data (traits ``base`` and ``tail``); every control works in the browser alone, since
// the kernel is busy running the cell. The root element carries what was drawn, for tests and curious users:
// data-points (buckets drawn, all panels), data-draws, data-distr (1 linear, 3 log, 4 asinh), data-smoothing,
// data-smooth-gap (how far the smoothed curves are from the raw ones, summed), data-x (step or time),
// data-zoomed (a panel keeps a zoomed x range while new points arrive), data-prepare-ms and data-draw-ms
// (the browser's time for the last update: preparing the columns, then uPlot's drawing), data-load-points
// (telemetry samples held by the load panels: GPU or CPU load over the run, see loads.js), data-overlays (earlier
// runs' series drawn beside this run's, all panels) and data-overlays-shown (those not hidden from the legend).
// The toolbar's CSV and PNG buttons download the series and the panels (export.js).
import uplotCss from "uplot/dist/uPlot.min.css";
import { joinSeries, firstTime, mostPoints, overlayRuns } from "./data.js";
import { download, panelsCanvas, seriesCsv } from "./export.js";
import { LoadPanels } from "./loads.js";
import { Panel } from "./panel.js";

const CSS = `
.nbt-chart { font: 12px sans-serif; }
.nbt-chart-controls { display: flex; gap: 14px; align-items: center; margin: 4px 0; flex-wrap: wrap; }
.nbt-chart-controls label { display: inline-flex; gap: 4px; align-items: center; }
.nbt-chart-toggle button { border: 1px solid #999; background: #fff; padding: 1px 8px; margin: 0; cursor: pointer; }
.nbt-chart-export button { border: 1px solid #999; background: #fff; padding: 1px 8px; margin: 0 2px; cursor: pointer; }
.nbt-chart-toggle button[aria-pressed="true"] { background: #1f77b4; border-color: #1f77b4; color: #fff; }
.nbt-chart-grid { display: grid; gap: 4px 10px; }
.nbt-chart-loads { display: grid; grid-template-columns: repeat(2, max-content); gap: 4px 10px; margin-top: 6px; }
.nbt-chart-hint { color: #777; }
.nbt-chart .u-title { font-size: 13px; font-weight: 600; }
.nbt-chart .u-legend { font-size: 11px; }
`;
const HEIGHT = 220;
const LOAD_HEIGHT = 170;

/** The widget's model as anywidget hands it to ``render``: the kernel's traits, and their change events.
 * @typedef {{get(name: string): any, on(event: string, callback: () => void): void,
 *            off(event: string, callback: () => void): void}} Model */
/** What the chart holds between draws.
 * @typedef {{log: boolean, xKey: string, weight: number, panels: Map<string, Panel>, draws: number,
 *            runs: import("./data.js").OverlayRun[], hidden: Set<string>,
 *            series?: import("./data.js").Series}} ChartState */

/** @param {number} count panels @returns {number} columns of the grid */
function columnsFor(count) {
  return count <= 1 ? 1 : count <= 4 ? 2 : 3;
}

/** @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag @param {Partial<HTMLElementTagNameMap[K]>} attrs @param {string} [text]
 * @returns {HTMLElementTagNameMap[K]} */
function control(tag, attrs, text) {
  const node = document.createElement(tag);
  Object.assign(node, attrs);
  if (text) node.textContent = text;
  return node;
}

/** Buttons of which one is pressed. @param {string[]} labels @param {(label: string) => void} onPick */
function toggle(labels, onPick) {
  const wrap = control("span", { className: "nbt-chart-toggle" });
  const buttons = labels.map((label, i) => {
    const button = control("button", { type: "button", className: "nbt-" + label.replace(/\W/g, "") }, label);
    button.addEventListener("click", () => {
      buttons.forEach((b, j) => b.setAttribute("aria-pressed", String(i === j)));
      onPick(label);
    });
    button.setAttribute("aria-pressed", String(i === 0));
    wrap.appendChild(button);
    return button;
  });
  return wrap;
}

/** @param {{model: Model, el: HTMLElement}} widget */
function render({ model, el }) {
  const style = control("style", {}, uplotCss + CSS);
  const root = control("div", { className: "nbt-chart" });
  /** @type {ChartState} */
  const state = { log: false, xKey: "step", weight: model.get("smoothing") || 0, panels: new Map(), draws: 0,
                  runs: overlayRuns(model.get("overlays")), hidden: new Set() };
  const slider = control("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(state.weight),
                                    className: "nbt-smoothing" });
  const weightText = control("span", {}, state.weight.toFixed(2));
  const smoothing = control("label", {}, "smoothing ");
  smoothing.append(slider, weightText);
  const controls = control("div", { className: "nbt-chart-controls" });
  controls.append(toggle(["linear", "log"], (v) => { state.log = v === "log"; rebuild(); }),
                  toggle(["step", "wall time"], (v) => { state.xKey = v === "step" ? "step" : "time"; rebuild(); }),
                  smoothing, exports(),
                  control("span", { className: "nbt-chart-hint" }, "drag to zoom, double-click to unzoom"));
  const hint = control("div", { className: "nbt-chart-hint" }, "nothing logged yet: call nbtrain.log(loss=...) in the cell");
  const grid = control("div", { className: "nbt-chart-grid" });
  const loadGrid = control("div", { className: "nbt-chart-loads" });
  root.append(style, controls, hint, grid, loadGrid);
  if (model.get("curves") === false) { // the load panels alone (%gpus): no curves, so no curve controls
    controls.style.display = "none";
    hint.style.display = "none";
  }
  el.appendChild(root);
  const loadWidth = () => Math.max(240, Math.floor(((root.clientWidth || 900) - 10) / 2));
  const loads = new LoadPanels(loadGrid, loadWidth(), LOAD_HEIGHT, () => { root.dataset.loadPoints = String(loads.points); });

  // The toolbar's downloads: CSV of the series as drawn (every bucket), PNG of the panels as shown.
  function exports() {
    const wrap = control("span", { className: "nbt-chart-export" });
    const csv = control("button", { type: "button", className: "nbt-export-csv", title: "download the series as CSV" },
                        "CSV");
    const png = control("button", { type: "button", className: "nbt-export-png", title: "download the chart as PNG" },
                        "PNG");
    csv.addEventListener("click", () => {
      const names = [...state.panels.values()].flatMap((p) => p.names);
      download(new Blob([seriesCsv(state.series || {}, names)], { type: "text/csv" }), "nbtrain-chart.csv");
    });
    png.addEventListener("click", () => {
      const plots = [...state.panels.values()].flatMap((p) => (p.plot ? [p.plot] : []));
      if (plots.length) {
        panelsCanvas(plots).toBlob((blob) => { if (blob) download(blob, "nbtrain-chart.png"); }, "image/png");
      }
    });
    wrap.append(csv, png);
    return wrap;
  }

  function width() {
    const cols = columnsFor(state.panels.size || 1);
    return Math.max(240, Math.floor(((root.clientWidth || 900) - 10 * (cols - 1)) / cols));
  }

  /** @param {Panel} panel @param {uPlot} u */
  function onDraw(panel, u) {
    state.draws += 1;
    root.dataset.drawMs = (performance.now() - panel.drawStarted).toFixed(2);
    let points = 0, gap = 0;
    for (const p of state.panels.values()) { points += p.points || 0; gap += p.smoothGap || 0; }
    const zoomed = [...state.panels.values()].some((p) => p.zoomed);
    let overlaysShown = 0, overlays = 0;
    for (const p of state.panels.values()) { const [s, d] = p.overlayCounts(); overlaysShown += s; overlays += d; }
    Object.assign(root.dataset, { points, draws: state.draws, distr: u.scales.y.distr, smoothing: state.weight,
                                  smoothGap: gap.toPrecision(6), x: state.xKey, zoomed, overlays, overlaysShown });
  }

  function draw() {
    const tail = model.get("tail");
    /** @type {[string, string[]][]} panel key, its names */
    const groups = (tail && tail.groups) || [];
    if (!groups.length) return;
    hint.style.display = "none";
    const series = joinSeries(model.get("base"), tail);
    state.series = series; // what the CSV export writes
    const t0 = firstTime(series);
    const keys = new Set(groups.map(([key]) => key));
    for (const [key, panel] of state.panels) if (!keys.has(key)) { panel.destroy(); state.panels.delete(key); }
    for (const [key, names] of groups) {
      let panel = state.panels.get(key);
      if (!panel || panel.names.join() !== names.join()) {
        if (panel) panel.destroy();
        const cell = control("div", {});
        grid.appendChild(cell);
        panel = new Panel(cell, key, names, { log: state.log, xKey: state.xKey, width: 300, height: HEIGHT,
                                              style: model.get("chart_style"), hidden: state.hidden }, onDraw);
        state.panels.set(key, panel);
      }
    }
    grid.style.gridTemplateColumns = `repeat(${columnsFor(state.panels.size)}, max-content)`;
    const w = width();
    const began = performance.now();
    const most = mostPoints(series, groups.flatMap(([, names]) => names));
    for (const panel of state.panels.values()) {
      if (panel.options.width !== w) panel.resize(w);
      panel.draw(series, state.weight, t0, most, state.runs);
    }
    root.dataset.prepareMs = (performance.now() - began).toFixed(2); // join, smooth, setData (drawing follows)
  }

  function rebuild() {
    for (const panel of state.panels.values()) {
      Object.assign(panel.options, { log: state.log, xKey: state.xKey });
      panel.destroy();
    }
    draw();
  }

  slider.addEventListener("input", () => {
    state.weight = Number(slider.value);
    weightText.textContent = state.weight.toFixed(2);
    draw();
  });
  let pending = false; // base and tail arrive together: draw once per message
  const onChange = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; draw(); });
  };
  model.on("change:tail", onChange);
  model.on("change:base", onChange);
  const onOverlays = () => { state.runs = overlayRuns(model.get("overlays")); onChange(); };
  model.on("change:overlays", onOverlays);
  const onLoad = () => loads.append(model.get("load")); // new samples only: each message appended once
  model.on("change:load", onLoad);
  const resize = new ResizeObserver(() => {
    for (const p of state.panels.values()) p.resize(width());
    loads.resize(loadWidth());
  });
  resize.observe(root);
  draw();
  onLoad();
  return () => {
    resize.disconnect();
    model.off("change:tail", onChange);
    model.off("change:base", onChange);
    model.off("change:overlays", onOverlays);
    model.off("change:load", onLoad);
    for (const panel of state.panels.values()) panel.destroy();
    loads.destroy();
  };
}

export default { render };
