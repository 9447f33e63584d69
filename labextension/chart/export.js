// @ts-check
// The chart's toolbar exports, made in the browser from what it holds (the kernel is busy with the cell):
// CSV of every series drawn — one row per bucket: series, step, time (unix seconds), mean, min, max — and a PNG
// of the panels as they are shown (zoom, scale and hidden series included), titles above their plots.

/** A CSV field, quoted when it holds a comma, a quote or a line break.
 * @param {string} text @returns {string} */
function csvField(text) {
  const s = String(text);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** @param {number} v @returns {string} */
function number(v) {
  return Number.isFinite(v) ? String(v) : "";
}

/** The CSV of ``series`` (data.joinSeries's columns), in ``names`` order: one row per bucket.
 * @param {Record<string, Record<"step" | "time" | "mean" | "min" | "max", Float64Array>>} series
 * @param {string[]} names @returns {string} */
export function seriesCsv(series, names) {
  const lines = ["series,step,time,mean,min,max"];
  for (const name of names) {
    const cols = series[name];
    if (!cols) continue;
    for (let i = 0; i < cols.mean.length; i++) {
      lines.push([csvField(name), number(cols.step[i]), number(cols.time[i]), number(cols.mean[i]),
                  number(cols.min[i]), number(cols.max[i])].join(","));
    }
  }
  return lines.join("\n") + "\n";
}

const TITLE_PX = 18;

/** What of a uPlot instance the picture needs: its root element and its canvas.
 * @typedef {{root: HTMLElement, ctx: CanvasRenderingContext2D}} Plot */

/** One canvas of the panels' plots, laid out as on the page, each under its title.
 * @param {Plot[]} plots @returns {HTMLCanvasElement} */
export function panelsCanvas(plots) {
  const ratio = window.devicePixelRatio || 1;
  const boxes = plots.map((u) => u.root.getBoundingClientRect());
  const left = Math.min(...boxes.map((b) => b.left)), top = Math.min(...boxes.map((b) => b.top));
  const right = Math.max(...boxes.map((b) => b.right));
  const bottom = Math.max(...plots.map((u) => u.ctx.canvas.getBoundingClientRect().bottom)); // no legend below
  const out = document.createElement("canvas");
  out.width = Math.ceil((right - left) * ratio);
  out.height = Math.ceil((bottom - top) * ratio);
  const ctx = /** @type {CanvasRenderingContext2D} */ (out.getContext("2d"));
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, out.width, out.height);
  plots.forEach((u, i) => {
    const box = boxes[i];
    const plot = u.ctx.canvas.getBoundingClientRect();
    ctx.fillStyle = "#000";
    ctx.font = `600 ${13 * ratio}px sans-serif`;
    ctx.textAlign = "center";
    ctx.fillText(u.root.querySelector(".u-title")?.textContent || "", (box.left - left + box.width / 2) * ratio,
                 (box.top - top + TITLE_PX - 4) * ratio);
    ctx.drawImage(u.ctx.canvas, (plot.left - left) * ratio, (plot.top - top) * ratio, plot.width * ratio,
                  plot.height * ratio);
  });
  return out;
}

/** Save ``blob`` as ``filename``, as a download link the page clicks.
 * @param {Blob} blob @param {string} filename */
export function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
