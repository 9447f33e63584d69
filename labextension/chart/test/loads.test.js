// @ts-check
// The load panels' columns: samples appended per update, gaps kept aligned, thinned past MAX_POINTS.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LoadPanels, MAX_POINTS, MIN_SPAN_S, thinned, timeRange } from "../loads.js";

/** The panels' data alone: drawing needs a browser, so build and draw only count their calls here. */
class Columns extends LoadPanels {
  constructor() {
    super(/** @type {HTMLElement} */ ({}), 300, 100, () => {});
    this.builds = 0;
    this.draws = 0;
  }

  build() { this.builds += 1; }

  draw() { this.draws += 1; }
}

/** @param {number[]} values */
function wire(values) {
  return new DataView(new Float64Array(values).buffer);
}

/** One update of the load trait: ``t`` and, per device, busy = memory = the values given.
 * @param {number[]} t @param {Record<string, number[]>} devices */
function update(t, devices) {
  const names = Object.keys(devices);
  /** @type {Record<string, DataView>} */
  const busy = {};
  for (const name of names) busy[name] = wire(devices[name]);
  const styles = Object.fromEntries(names.map((n) => [n, { color: "#000000", width: 1, dash: [] }]));
  return { t: wire(t), devices: names, titles: ["GPU load", "GPU memory"], busy, memory: busy, styles };
}

test("thinning keeps every other sample from the first", () => {
  assert.deepEqual(thinned([0, 1, 2, 3, 4]), [0, 2, 4]);
});

test("a device missing from an update, or a NaN sample, is a gap; the columns stay aligned", () => {
  const panels = new Columns();
  panels.append(update([0, 1], { "GPU 0": [10, NaN] }));
  panels.append(update([2], { "GPU 1": [30] }));
  assert.deepEqual(panels.t, [0, 1, 2]);
  assert.deepEqual(panels.columns.busy["GPU 0"], [10, null, null]);
  assert.deepEqual(panels.columns.busy["GPU 1"], [null, null, 30], "a device that appears later starts with gaps");
  assert.equal(panels.builds, 2, "a new device rebuilds the panels");
  panels.append(update([3], { "GPU 0": [40], "GPU 1": [50] }));
  assert.equal(panels.draws, 1, "the same devices: drawn again, not rebuilt");
});

test("past MAX_POINTS samples every other one goes, all along the run: memory stays flat", () => {
  const panels = new Columns();
  const chunk = 500;
  for (let start = 0; start < 4 * MAX_POINTS; start += chunk) {
    const t = Array.from({ length: chunk }, (_, i) => start + i);
    panels.append(update(t, { cpu: t.map((v) => v % 100) }));
    assert.ok(panels.points <= MAX_POINTS, `${panels.points} samples held`);
    assert.equal(panels.columns.busy.cpu.length, panels.points);
  }
  assert.equal(panels.t[0], 0, "the start of the run is still drawn");
  assert.ok(panels.t[panels.points - 1] > 3.9 * MAX_POINTS, "and its end");
});

test("the memory panel names the machine's line by its RAM", () => {
  const panels = new Columns();
  panels.append({ ...update([0], { "rank 0": [10], "CPU (machine)": [20] }),
                  memory_labels: { "CPU (machine)": "RAM (machine)" } });
  assert.deepEqual(panels.memoryLabels, { "CPU (machine)": "RAM (machine)" });
});

test("the x axis of a run's first samples spans MIN_SPAN_S from the first, never a range around a lone point", () => {
  assert.deepEqual(timeRange(0, 0), [0, MIN_SPAN_S]);
  assert.deepEqual(timeRange(12, 12.5), [12, 12 + MIN_SPAN_S]);
  assert.deepEqual(timeRange(null, null), [0, MIN_SPAN_S]);
  assert.deepEqual(timeRange(0, 35), [0, 35]);
});
