// @ts-check
// The toolbar's CSV and the earlier runs' columns, run by node's own test runner: `node --test chart/test/`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { overlayRuns } from "../data.js";
import { seriesCsv } from "../export.js";

/** @param {number[]} values */
const f64 = (values) => new Float64Array(values);

test("the CSV has a row per bucket of every series, names quoted where they need it", () => {
  const cols = { step: f64([0, 1]), time: f64([1000.5, 1001.5]), mean: f64([2, NaN]), min: f64([1, 1]), max: f64([3, 3]) };
  const csv = seriesCsv({ loss: cols, "a,b": cols }, ["loss", "missing", "a,b"]);
  assert.equal(csv, "series,step,time,mean,min,max\nloss,0,1000.5,2,1,3\nloss,1,1001.5,,1,3\n"
                    + '"a,b",0,1000.5,2,1,3\n"a,b",1,1001.5,,1,3\n');
});

test("the earlier runs arrive as bytes and are read as floats", () => {
  const wire = (/** @type {number[]} */ v) => new DataView(f64(v).buffer);
  const [run] = overlayRuns({ runs: [{ number: 2, label: "--amp bf16", series: { loss: { step: wire([0, 1]),
                                                                                          time: wire([5, 6]), mean: wire([3, 2]) } } }] });
  assert.deepEqual([run.number, run.label, Array.from(run.series.loss.mean)], [2, "--amp bf16", [3, 2]]);
  assert.deepEqual(overlayRuns(null), []);
});
