/**
 * NbtrainModel: polls the server routes and keeps the latest answers plus a short load history.
 *
 * One Poll (from @lumino/polling) drives the three routes together. It goes on standby while the page is
 * hidden (`standby: 'when-hidden'`), backs off when the server stops answering, and its interval follows
 * the `refreshInterval` setting while nothing runs; while a notebook's kernel is busy or a run is active it
 * polls every half second, and a kernel turning busy or idle asks at once (pace.ts), so the status bar follows
 * a cell within half a second.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { requestAPI } from './request';
import { IDetachedRun, IMachine, IProcess, IProcessesReply, IRun, IRunsReply } from './types';

/** One series per device: GPU utilisation and memory use, or CPU load and RAM use (percent). */
export interface ISeries {
  load: number[];
  memory: number[];
}

/** The interval while something runs: the badge follows a cell within this. */
const ACTIVE_INTERVAL_SECONDS = 0.5;

export class NbtrainModel {
  constructor(options: { intervalSeconds: number; historyLength: number }) {
    this._historyLength = options.historyLength;
    this._idleSeconds = options.intervalSeconds;
    this._poll = new Poll({
      auto: true,
      factory: () => this._refresh(),
      frequency: this._frequency(options.intervalSeconds),
      name: 'nbtrain:status',
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get machine(): IMachine | null {
    return this._machine;
  }

  get runs(): IRun[] {
    return this._runs;
  }

  /** This user's --detach runs on this machine, newest first. */
  get detached(): IDetachedRun[] {
    return this._detached;
  }

  get processes(): IProcess[] {
    return this._processes;
  }

  /** Why the last refresh failed, or null. */
  get error(): string | null {
    return this._error;
  }

  /** How many samples a history keeps. */
  get historyLength(): number {
    return this._historyLength;
  }

  /** Load/memory history of a GPU (key `gpu<index>`) or of the machine (key `cpu`). */
  history(key: string): ISeries {
    return this._history.get(key) ?? { load: [], memory: [] };
  }

  configure(options: { intervalSeconds: number; historyLength: number }): void {
    this._historyLength = options.historyLength;
    this._idleSeconds = options.intervalSeconds;
    this._pace();
  }

  /** A notebook's kernel (by a key of the caller's) turned busy or idle: ask now, then at the pace that fits. */
  kernelBusy(key: string, busy: boolean): void {
    if (busy === this._busyKernels.has(key)) {
      return;
    }
    if (busy) {
      this._busyKernels.add(key);
    } else {
      this._busyKernels.delete(key);
    }
    this._pace();
    void this.refresh().catch(() => undefined); // a refresh superseded by a later one rejects; the next tick asks again
  }

  /** Ask now instead of at the next tick (after a stop, for example). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  /** Fast while a kernel is busy or a run is active, else the setting's interval. */
  private _pace(): void {
    const running =
      this._busyKernels.size > 0 || this._runs.some(run => run.active) || this._detached.some(run => run.active);
    this._poll.frequency = this._frequency(running ? Math.min(ACTIVE_INTERVAL_SECONDS, this._idleSeconds) : this._idleSeconds);
  }

  private _frequency(seconds: number) {
    const interval = Math.max(0.5, seconds) * 1000;
    return { interval, backoff: true, max: Math.max(interval, 30 * 1000) };
  }

  private async _refresh(): Promise<void> {
    try {
      const [machine, runs, processes] = await Promise.all([
        requestAPI<IMachine>('gpus'),
        requestAPI<IRunsReply>('runs'),
        requestAPI<IProcessesReply>('processes')
      ]);
      this._machine = machine;
      this._runs = runs.runs;
      this._detached = runs.detached;
      this._processes = processes.processes;
      this._error = null;
      this._record(machine);
      this._pace();
    } catch (error) {
      this._error = (error as Error).message;
      this._changed.emit();
      throw error; // lets the Poll back off while the server is away
    }
    this._changed.emit();
  }

  private _record(machine: IMachine): void {
    if (machine.gpus.length === 0) {
      const ram = machine.ram.total ? (100 * machine.ram.used) / machine.ram.total : 0;
      this._push('cpu', machine.cpu.percent, ram);
    }
    for (const gpu of machine.gpus) {
      const memory = gpu.memory_total ? (100 * (gpu.memory_used ?? 0)) / gpu.memory_total : 0;
      this._push(`gpu${gpu.index}`, gpu.utilization ?? 0, memory);
    }
  }

  private _push(key: string, load: number, memory: number): void {
    const series = this._history.get(key) ?? { load: [], memory: [] };
    series.load.push(load);
    series.memory.push(memory);
    const extra = series.load.length - this._historyLength;
    if (extra > 0) {
      series.load.splice(0, extra);
      series.memory.splice(0, extra);
    }
    this._history.set(key, series);
  }

  private _busyKernels = new Set<string>();
  private _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private _history = new Map<string, ISeries>();
  private _idleSeconds: number;
  private _historyLength: number;
  private _machine: IMachine | null = null;
  private _poll: Poll;
  private _processes: IProcess[] = [];
  private _runs: IRun[] = [];
  private _detached: IDetachedRun[] = [];
}
