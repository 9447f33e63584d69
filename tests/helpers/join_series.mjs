// The chart's own joinSeries (labextension/chart/data.js) over updates the kernel's feed made: reads JSON lines
// [base, tail] on stdin (each column a list of floats), writes the joined series per line (lists again).
import { createInterface } from "node:readline";
import { joinSeries } from "../../labextension/chart/data.js";

function asFloats(update) {
  if (!update) return update;
  const series = {};
  for (const [name, cols] of Object.entries(update.series)) {
    series[name] = Object.fromEntries(Object.entries(cols).map(([k, v]) => [k, new Float64Array(v)]));
  }
  return { ...update, series };
}

for await (const line of createInterface({ input: process.stdin })) {
  const [base, tail] = JSON.parse(line);
  const joined = joinSeries(asFloats(base), asFloats(tail));
  const out = Object.fromEntries(Object.entries(joined).map(([name, cols]) => [
    name, Object.fromEntries(Object.entries(cols).map(([k, v]) => [k, Array.from(v)]))]));
  process.stdout.write(JSON.stringify(out) + "\n");
}
