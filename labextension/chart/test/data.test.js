// @ts-check
// The chart's data joining, bucketing and smoothing, run by node's own test runner: `node --test chart/test/`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { COLUMNS, allPositive, firstTime, floats, joinSeries, mostPoints, smooth, worthSmoothing, overlayGroups, overlayLabel, overlayKey } from "../data.js";

/** A column as ipywidgets delivers it: a DataView over little-endian float64 bytes.
 * @param {number[]} values */
function wire(values) {
  return new DataView(new Float64Array(values).buffer);
}

/** One series' five columns on the wire, a bucket per step, mean = step / 10.
 * @param {number[]} steps */
function columns(steps) {
  const mean = steps.map((s) => s / 10);
  return { step: wire(steps), time: wire(steps.map((s) => 1000 + s)), mean: wire(mean), min: wire(mean), max: wire(mean) };
}

test("a column arrives as bytes and is read as floats, copied", () => {
  const bytes = new Float64Array([1.5, -2, NaN]);
  const view = new DataView(bytes.buffer);
  const read = floats(view);
  assert.deepEqual(Array.from(read.slice(0, 2)), [1.5, -2]);
  assert.ok(Number.isNaN(read[2]));
  bytes[0] = 9;
  assert.equal(read[0], 1.5, "the chart keeps its own copy");
  assert.equal(floats(undefined).length, 0);
  assert.equal(floats(read), read, "floats already: used as they are");
});

test("the base's buckets come before the tail's when both are of one epoch", () => {
  const base = { epoch: 3, series: { loss: columns([0, 1, 2]) } };
  const tail = { epoch: 3, series: { loss: columns([3, 4]), acc: columns([4]) } };
  const joined = joinSeries(base, tail);
  assert.deepEqual(Array.from(joined.loss.step), [0, 1, 2, 3, 4]);
  assert.deepEqual(Array.from(joined.loss.time), [1000, 1001, 1002, 1003, 1004]);
  assert.deepEqual(Array.from(joined.acc.step), [4], "a series new in the tail");
  for (const key of COLUMNS) assert.equal(joined.loss[key].length, 5);
});

test("a tail of a newer epoch stands alone: the kernel rebased, the old base is stale", () => {
  const base = { epoch: 1, series: { loss: columns([0, 1, 2]) } };
  const tail = { epoch: 2, series: { loss: columns([0, 8]) } };
  assert.deepEqual(Array.from(joinSeries(base, tail).loss.step), [0, 8]);
  assert.deepEqual(joinSeries(base, null), {});
});

test("smoothing removes the start-up bias, as TensorBoard's and the kernel's", () => {
  assert.deepEqual(smooth([2, 2, 2, 2], 0.9).map((v) => +v.toFixed(12)), [2, 2, 2, 2], "a constant stays constant");
  const [first, second] = smooth([1, 3], 0.5);
  assert.equal(first, 1, "the first value is itself, not pulled towards 0");
  assert.equal(second, (0.25 + 1.5) / 0.75, "second: (0.5·0.5·1 + 0.5·3) / (1 - 0.5²)");
  assert.deepEqual(smooth(new Float64Array([1, 5]), 0), [1, 5], "weight 0: the raw values");
});

test("only series dense enough beside the longest one are smoothed", () => {
  const rule = { smooth_min_points: 10, smooth_dense_share: 0.25 };
  assert.equal(worthSmoothing(10, 10, rule), false, "at most smooth_min_points: too few to smooth");
  assert.equal(worthSmoothing(30, 100, rule), true);
  assert.equal(worthSmoothing(20, 100, rule), false, "a sparse validation curve beside a dense loss");
});

test("the panels' extent: most buckets, first time, whether a log scale fits", () => {
  const series = joinSeries(null, { epoch: 0, series: { loss: columns([1, 2, 3]), val: columns([2]) } });
  assert.equal(mostPoints(series, ["loss", "val"]), 3);
  assert.equal(mostPoints(series, ["missing"]), 0);
  assert.equal(firstTime(series), 1001);
  assert.equal(firstTime({}), 0);
  assert.equal(allPositive(series, ["loss"]), true);
  const withZero = joinSeries(null, { epoch: 0, series: { loss: columns([0, 1]) } });
  assert.equal(allPositive(withZero, ["loss"]), false, "a 0 cannot be drawn on a log scale");
});

test("earlier runs that differed alike share one legend row, each run once", () => {
  const cols = { step: new Float64Array([0, 1]), time: new Float64Array([0, 1]), mean: new Float64Array([1, 0.5]) };
  /** @param {number} number @param {string} label */
  const run = (number, label) => ({ number, label, series: { loss: cols } });
  const runs = [run(1, "the same cell and options"), run(2, "the same cell and options"), run(3, "--amp off")];
  const groups = overlayGroups(runs, ["loss", "val_loss"]);
  assert.deepEqual(groups.get(overlayKey("loss", "the same cell and options")), [1, 2]);
  assert.deepEqual(groups.get(overlayKey("loss", "--amp off")), [3]);
  assert.equal(groups.size, 2, "val_loss was not logged: no group");
  assert.equal(overlayLabel("loss", [1, 2], "the same cell and options"), "loss · runs 1, 2: the same cell and options");
  assert.equal(overlayLabel("loss", [3], "--amp off"), "loss · run 3: --amp off");
});
