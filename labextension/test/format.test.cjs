// The panel's and status bar's number forms (src/format.ts), run by node's own test runner on the compiled
// module: tests/test_lab_unit.py compiles src/ with tsconfig.unit.json and runs `node --test` on this folder.
const { test } = require("node:test");
const assert = require("node:assert/strict");
const { gib, percent, statusText, count, loss, duration, rankSpan, nodeText, groupsText, pidsText, leaseText, queueText } = require("../src/format.js");

test("GiB: one decimal below 10, none above, ? when unknown", () => {
  assert.equal(gib(1.5 * 2 ** 30), "1.5");
  assert.equal(gib(41 * 2 ** 30), "41");
  assert.equal(gib(0), "0");
  assert.equal(gib(null), "?");
  assert.equal(gib(undefined), "?");
});

test("percent rounds and says N/A when unknown", () => {
  assert.equal(percent(72.6), "73%");
  assert.equal(percent(null), "N/A");
});

test("the status bar names the first GPU and how many more, or the CPU and RAM without one", () => {
  const gpu = (index) => ({ index, utilization: 73, memory_used: 41 * 2 ** 30, memory_total: 80 * 2 ** 30 });
  const machine = { gpus: [gpu(0), gpu(1), gpu(2)], cpu: { percent: 12 }, ram: { used: 5 * 2 ** 30, total: 24 * 2 ** 30 } };
  assert.equal(statusText(machine), "GPU0 73% · 41/80 GiB (+2)");
  assert.equal(statusText({ ...machine, gpus: [] }), "CPU 12% · RAM 5.0/24 GiB");
  assert.equal(statusText(null), "nbtrain …");
});

test("a noun agrees with its number", () => {
  assert.equal(count("rank", 1), "1 rank");
  assert.equal(count("rank", 0), "0 ranks");
  assert.equal(count("rank", 2), "2 ranks");
});

test("losses: four decimals in the usual range, exponents outside it, a dash when unknown", () => {
  assert.equal(loss(0.12345), "0.1235");
  assert.equal(loss(0.00001234), "1.234e-5");
  assert.equal(loss(123456), "1.235e+5");
  assert.equal(loss(null), "–");
});

test("durations in seconds, minutes, hours", () => {
  assert.equal(duration(42.4), "42 s");
  assert.equal(duration(185), "3 min 5 s");
  assert.equal(duration(2 * 3600 + 600), "2 h 10 min");
  assert.equal(duration(-3), "0 s");
});

test("a node's ranks as a span when contiguous, a list otherwise", () => {
  assert.equal(rankSpan([1]), "rank 1");
  assert.equal(rankSpan([2, 3]), "ranks 2–3");
  assert.equal(rankSpan([0, 2]), "ranks 0, 2");
  assert.equal(rankSpan([]), "ranks ");
});

test("a node's line: where it runs, its ranks, its load and each GPU with its health", () => {
  const node = { name: "b", host: "gpu2", address: "10.0.0.8", ranks: [2, 3], state: "running", cpu_percent: 12,
                 ram_percent: 40, gpus: [{ index: 0, utilization: 97, memory_used: 41 * 2 ** 30,
                                           memory_total: 80 * 2 ** 30, health: "slowed by power cap" }] };
  assert.equal(nodeText(node), "node b · gpu2 (10.0.0.8) · ranks 2–3 · running · CPU 12% · RAM 40% · "
               + "GPU0 97% 41/80 GiB (slowed by power cap)");
  assert.equal(nodeText({ ...node, cpu_percent: null, gpus: [] }), "node b · gpu2 (10.0.0.8) · ranks 2–3 · running");
});

test("a --ft run's replica groups: each by its ranks, its state, and how often it was replaced", () => {
  const group = (ranks, state, replaced) => ({ group: 0, ranks, state, since: 0, replaced });
  assert.equal(groupsText([group([0], "in quorum", 0), group([1], "rejoined", 1), group([2], "recovering from a peer", 2)]),
               "replica groups: rank 0 in quorum · rank 1 rejoined (replaced 1×) · rank 2 recovering from a peer (replaced 2×)");
  assert.equal(groupsText([group([2, 3], "out", 1)]), "replica groups: ranks 2–3 out (replaced 1×)");
});

test("a run's process ids say whose they are: the kernel's, then each rank's", () => {
  const run = { kernel_pid: 15790, ranks: [{ rank: 0, pid: 15792, alive: true }, { rank: 1, pid: 15793, alive: false }] };
  assert.equal(pidsText(run), "process ids: kernel 15790 · rank 0 15792 · rank 1 15793 (gone)");
  assert.equal(pidsText({ kernel_pid: null, ranks: [] }), "process ids: kernel ?");
});

test("who holds a GPU: the user (you for yours), the notebook's file, and since when it trains or waits warm", () => {
  const since = new Date(2026, 10, 27, 12, 4).getTime() / 1000;  // 12:04 on this machine's clock
  const lease = { gpu: 0, user: "bob", notebook: "llm.ipynb", since, state: "busy", mine: false };
  assert.equal(leaseText(lease), "bob · llm.ipynb · training since 12:04");
  assert.equal(leaseText({ ...lease, mine: true, notebook: "nb/a.ipynb", state: "idle-warm" }), "you · nb/a.ipynb · warm since 12:04");
  assert.equal(leaseText({ ...lease, notebook: null, since: null, state: null }), "bob · held");  // hidden by the policy
});

test("the queue names who waits, first in line first, or says nothing when nobody waits", () => {
  const at = (h, m) => new Date(2026, 10, 27, h, m).getTime() / 1000;
  assert.equal(queueText([{ user: "carol", since: at(12, 10), mine: false }, { user: "root", since: at(12, 12), mine: true }]),
               "2 runs wait for GPUs: carol (since 12:10), you (since 12:12)");
  assert.equal(queueText([{ user: "carol", since: at(9, 5), mine: false }]), "1 run waits for GPUs: carol (since 09:05)");
  assert.equal(queueText([]), "");
});
