// The in-place DOM helpers (src/dom.ts) and the sparkline (src/sparkline.ts) on a real DOM implementation
// (linkedom), run by node's own test runner on the compiled modules (tests/test_lab_unit.py).
const { test } = require("node:test");
const assert = require("node:assert/strict");
const { parseHTML } = require("linkedom");

const { document } = parseHTML("<!doctype html><html><body></body></html>");
globalThis.document = document;
const { el, setText, setAttr, setShown, syncList } = require("../src/dom.js");
const { createSparkline, drawSparkline } = require("../src/sparkline.js");

test("el makes a node with its class and text", () => {
  const node = el("span", "nbtrain-Name", "GPU 0");
  assert.equal(node.tagName, "SPAN");
  assert.equal(node.className, "nbtrain-Name");
  assert.equal(node.textContent, "GPU 0");
});

test("setText and setAttr write only what differs, and null removes an attribute", () => {
  const node = el("div", "row", "a");
  const text = node.firstChild;
  setText(node, "a");
  assert.equal(node.firstChild, text, "the same text keeps its text node");
  setText(node, "b");
  assert.equal(node.textContent, "b");
  setAttr(node, "title", "x");
  assert.equal(node.getAttribute("title"), "x");
  setAttr(node, "title", null);
  assert.equal(node.hasAttribute("title"), false);
});

test("setShown hides and shows a node that stays in place", () => {
  const node = el("div", "row");
  setShown(node, false);
  assert.equal(node.hidden, true);
  setShown(node, true);
  assert.equal(node.hidden, false);
});

function rowOf(item) {
  const node = el("div", "row");
  return { node, update: (next) => setText(node, next.label) };
}

test("syncList keeps each key's node, removes gone keys and follows the new order", () => {
  const container = el("div", "list");
  const rows = new Map();
  const key = (item) => item.id;
  syncList(container, rows, [{ id: "a", label: "A" }, { id: "b", label: "B" }], key, rowOf);
  const [a, b] = [rows.get("a").node, rows.get("b").node];
  assert.deepEqual([...container.children].map((n) => n.textContent), ["A", "B"]);
  syncList(container, rows, [{ id: "c", label: "C" }, { id: "b", label: "B2" }, { id: "a", label: "A" }], key, rowOf);
  assert.deepEqual([...container.children].map((n) => n.textContent), ["C", "B2", "A"]);
  assert.equal(rows.get("a").node, a, "a kept key keeps its node");
  assert.equal(rows.get("b").node, b);
  syncList(container, rows, [{ id: "b", label: "B2" }], key, rowOf);
  assert.deepEqual([...container.children].map((n) => n.textContent), ["B2"]);
  assert.equal(rows.has("a"), false);
});

function pointsOf(svg) {
  return svg.querySelector("polyline").getAttribute("points").split(" ").map((p) => p.split(",").map(Number));
}

test("a sparkline fills from the right at a fixed time scale, values clamped to 0–100", () => {
  const svg = createSparkline("load");
  assert.match(svg.getAttribute("class"), /nbtrain-Sparkline load/);
  drawSparkline(svg, [0, 50, 100, 150], 11);
  const points = pointsOf(svg);
  assert.equal(points.length, 4);
  assert.deepEqual(points.map(([x]) => x), [70, 80, 90, 100], "the newest on the right, 10 units apart");
  assert.equal(points[0][1], 23, "0 % at the bottom");
  assert.equal(points[2][1], 1, "100 % at the top");
  assert.equal(points[3][1], 1, "150 % drawn as 100 %");
});

test("one sample is drawn as a short flat line, none as nothing", () => {
  const svg = createSparkline("load");
  drawSparkline(svg, [40], 5);
  const points = pointsOf(svg);
  assert.equal(points.length, 2);
  assert.equal(points[0][1], points[1][1]);
  drawSparkline(svg, [], 5);
  assert.equal(svg.querySelector("polyline").getAttribute("points"), "");
});
