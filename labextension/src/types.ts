/**
 * The JSON the server routes return (see nbtrain/server/handlers.py and gpus.py for the contract).
 *
 * tests/test_lab_contract.py reads these interfaces and checks every route's real answer against them
 * (keys both ways, and the simple types), so keep to the forms it parses: `interface X { a: T; b?: U }`
 * with unions, `T[]`, inline `{ ... }` objects and `{ [name: string]: T }` maps.
 */

export interface IGpuProcess {
  pid: number;
  memory_used: number | null;
}

export interface IGpu {
  index: number;
  name: string;
  uuid: string;
  utilization: number | null;
  memory_used: number | null;
  memory_total: number | null;
  temperature: number | null;
  /** Watts now and the enforced limit; null where the driver does not report them. */
  power: number | null;
  power_limit: number | null;
  /** null: unknown (the driver lists none while memory is in use, as in VMs; or cannot list them) */
  processes: IGpuProcess[] | null;
}

/** A GPU leased by a run or a warm pool of any nbtrain kernel on the machine (another user's: name and file only). */
export interface ILease {
  gpu: number;
  user: string;
  notebook: string | null;
  since: number | null;
  state: 'busy' | 'idle-warm' | null;
  mine: boolean;
}

/** POST leases/release: the GPU given back, and whose warm ranks were stopped for it. */
export interface IReleaseReply {
  gpu: number;
  kernel_id: string;
  path: string | null;
  message: string;
}

/** A run waiting in the machine's queue for GPUs, first in line first. */
export interface IWaiting {
  user: string;
  since: number;
  mine: boolean;
}

export interface IMachine {
  time: number;
  gpu_error: string | null;
  gpus: IGpu[];
  cpu: { percent: number; count: number };
  ram: { used: number; total: number };
  notes?: string[];
  leases: ILease[];
  queue: IWaiting[];
  lease_error: string | null;
}

export interface IRank {
  rank: number;
  pid: number;
  device: string | null;
  gpu_index: number | null;
  alive: boolean;
}

/** One GPU of a node, from its last heartbeat. */
export interface INodeGpu {
  index: number;
  utilization: number | null;
  memory_used: number | null;
  memory_total: number | null;
  health: string; // its health line (clocks, PCIe, NVLink, ECC, Xid), written by the kernel from the node's readings
}

/** A run's state: nbtrain.kernel.observers.events.RunState's values (tests/test_lab_contract.py checks they agree). */
export type RunState = 'starting' | 'running' | 'finished' | 'failed' | 'interrupted';

/** A joined node's state: nbtrain.kernel.cluster.hub.NodeState's values (leaving: preempted, told to go), or lost. */
export type NodeState = 'idle' | 'running' | 'leaving' | 'lost';

/** A detached run's state: nbtrain.wire.runfolder.RecordedState's values (checked as RunState's are). */
export type DetachedState = 'running' | 'finished' | 'failed' | 'stopped';

/** A machine of a `--nodes` run: what its heartbeats say (telemetry null before the first one). */
export interface INode {
  name: string;
  host: string;
  address: string;
  ranks: number[];
  state: NodeState;
  last_heard: number;
  cpu_percent: number | null;
  ram_percent: number | null;
  gpus: INodeGpu[];
  cpus: number | null; // the machine's cores, as its agent said when it joined
}

/** A --ft replica group's state: nbtrain.kernel.observers.events.GroupState's values. */
export type GroupState = 'in quorum' | 'out' | 'recovering from a peer' | 'rejoined';

/** A replica group of a --ft run, as the kernel's ReplicaWatch last said. */
export interface IReplicaGroup {
  group: number;
  ranks: number[];
  state: GroupState;
  since: number; // unix time it entered its state
  replaced: number; // times new ranks took its place
}

export interface IRun {
  kernel_id: string;
  kernel_pid: number | null;
  path: string | null;
  name: string | null;
  run_id: string | null;
  state: RunState;
  active: boolean;
  nprocs: number | null;
  backend: string | null;
  device_type: string | null;
  gpu_ids: number[];
  ranks: IRank[];
  step: number | null;
  loss: number | null;
  metrics: { [name: string]: number };
  started: number | null;
  updated: number | null;
  ended: number | null;
  summary: string | null;
  /** A --nodes run's machines; empty on one machine. */
  nodes: INode[];
  /** A --ft run's replica groups and their states; empty without --ft. */
  replica_groups: IReplicaGroup[];
  /** 0, or the kernel's background run of that number (--background: stopped with run.stop(), not from here). */
  background: number;
}

export interface IProcess {
  pid: number;
  gpu_index: number;
  memory_used: number | null;
  process_name: string | null;
  user: string | null;
  kernel_id: string | null;
  path: string | null;
  rank: number | null;
}

/** A --detach run of this user's on this machine, read from its folder (it may have outlived its kernel). */
export interface IDetachedRun {
  run_id: string;
  state: DetachedState;
  active: boolean;
  step: number | null;
  nprocs: number;
  started: number;
  ended: number | null;
  /** The notebook that started it, as a path under the server's root (null: unknown, or outside the root). */
  notebook: string | null;
  /** That notebook is no longer there (or was never known): the panel offers to follow the run from here. */
  notebook_gone: boolean;
  /** The line that follows it from a notebook: `%distributed_attach <run_id>`. */
  attach: string;
}

/** GET /nbtrain/runs */
export interface IRunsReply {
  runs: IRun[];
  detached: IDetachedRun[];
}

/** POST /nbtrain/detached/stop (202); a refusal (4xx) is `{ message }` alone. */
export interface IDetachedStopReply {
  run_id: string;
  message: string;
}

/** GET /nbtrain/processes */
export interface IProcessesReply {
  processes: IProcess[];
}

/** POST /nbtrain/stop (202); a refusal (4xx) is `{ message }` alone. */
export interface IStopReply {
  kernel_id: string;
  path: string | null;
  run_id: string | null;
  message: string;
}

/** Any refusal (4xx/5xx): the server's explanation; requestAPI throws it as the error's message. */
export interface IErrorReply {
  message: string;
  reason?: string | null;
}
