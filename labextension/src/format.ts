/**
 * Short human forms of the numbers the panel and the status bar show.
 */
import { ILease, IMachine, IWaiting, INode, IReplicaGroup, IRun } from './types';

const GiB = 2 ** 30;

export function gib(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '?';
  }
  const value = bytes / GiB;
  return value >= 10 || value === 0 ? value.toFixed(0) : value.toFixed(1);
}

export function percent(value: number | null | undefined): string {
  return value === null || value === undefined ? 'N/A' : `${Math.round(value)}%`;
}

/** "GPU0 73% · 41/80 GiB", or "CPU 12% · RAM 5/24 GiB" on a machine without a usable GPU. */
export function statusText(machine: IMachine | null): string {
  if (!machine) {
    return 'nbtrain …';
  }
  const gpu = machine.gpus[0];
  if (gpu) {
    const more = machine.gpus.length > 1 ? ` (+${machine.gpus.length - 1})` : '';
    return `GPU${gpu.index} ${percent(gpu.utilization)} · ${gib(gpu.memory_used)}/${gib(gpu.memory_total)} GiB${more}`;
  }
  return `CPU ${percent(machine.cpu.percent)} · RAM ${gib(machine.ram.used)}/${gib(machine.ram.total)} GiB`;
}

/** "1 rank", "2 ranks", "0 ranks": the noun agrees with the number, as in nbtrain's own texts (nbtrain/common/words.py). */
export function count(word: string, n: number): string {
  return `${n} ${n === 1 ? word : `${word}s`}`;
}

export function loss(value: number | null | undefined): string {
  if (value === null || value === undefined) {
    return '–';
  }
  return Math.abs(value) >= 1e-3 && Math.abs(value) < 1e4 ? value.toFixed(4) : value.toExponential(3);
}

/** "42 s", "3 min 5 s", "2 h 10 min". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** "ranks 2–3", "rank 1", "ranks 0, 2": a node's global ranks. */
export function rankSpan(ranks: number[]): string {
  if (ranks.length === 1) {
    return `rank ${ranks[0]}`;
  }
  const contiguous = ranks.every((r, i) => i === 0 || r === ranks[i - 1] + 1);
  return contiguous && ranks.length ? `ranks ${ranks[0]}–${ranks[ranks.length - 1]}` : `ranks ${ranks.join(', ')}`;
}

/** "node b · gpu2 (10.0.0.8) · ranks 2–3 · running · CPU 12% · RAM 40% · GPU0 97% 41/80 GiB". */
export function nodeText(node: INode): string {
  const parts = [`node ${node.name}`, `${node.host} (${node.address})`, rankSpan(node.ranks), node.state];
  if (node.cpu_percent !== null) {
    parts.push(`CPU ${percent(node.cpu_percent)}`, `RAM ${percent(node.ram_percent)}`);
  }
  for (const gpu of node.gpus) {
    const health = gpu.health ? ` (${gpu.health})` : ''; // clocks, PCIe, NVLink, ECC, Xid: from the node's readings
    parts.push(`GPU${gpu.index} ${percent(gpu.utilization)} ${gib(gpu.memory_used)}/${gib(gpu.memory_total)} GiB${health}`);
  }
  return parts.join(' · ');
}

/** "replica groups: rank 0 in quorum · rank 1 in quorum · rank 2 recovering from a peer (replaced 1×)" (--ft). */
export function groupsText(groups: IReplicaGroup[]): string {
  const each = groups.map(g => `${rankSpan(g.ranks)} ${g.state}${g.replaced ? ` (replaced ${g.replaced}×)` : ''}`);
  return 'replica groups: ' + each.join(' · ');
}

/** "process ids: kernel 15790 · rank 0 15792 · rank 1 15793 (gone)": which process is which, for `top` or `kill`. */
export function pidsText(run: IRun): string {
  const ranks = run.ranks.map(r => `rank ${r.rank} ${r.pid}${r.alive ? '' : ' (gone)'}`);
  return ['process ids: kernel ' + (run.kernel_pid ?? '?'), ...ranks].join(' · ');
}

/** "12:04": a time of day on this browser's clock, from seconds since the epoch. */
export function clock(seconds: number): string {
  const when = new Date(seconds * 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  return `${two(when.getHours())}:${two(when.getMinutes())}`;
}

/** "bob · llm.ipynb · training since 12:04", "you · nb/a.ipynb · warm since 12:10": who holds a GPU, and how. */
export function leaseText(lease: ILease): string {
  const parts = [lease.mine ? 'you' : lease.user];
  if (lease.notebook) {
    parts.push(lease.notebook);
  }
  const doing = lease.state === 'idle-warm' ? 'warm' : lease.state === 'busy' ? 'training' : 'held';
  parts.push(lease.since === null ? doing : `${doing} since ${clock(lease.since)}`);
  return parts.join(' · ');
}

/** "2 runs wait for GPUs: carol (since 12:10), you (since 12:12)", first in line first; "" when none waits. */
export function queueText(queue: IWaiting[]): string {
  if (queue.length === 0) {
    return '';
  }
  const waiting = queue.map(w => `${w.mine ? 'you' : w.user} (since ${clock(w.since)})`);
  return `${count('run', queue.length)} ${queue.length === 1 ? 'waits' : 'wait'} for GPUs: ${waiting.join(', ')}`;
}
