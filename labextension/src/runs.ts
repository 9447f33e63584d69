/**
 * The panel's training runs: one row per run (keyed by kernel and run id) with its notebook, state,
 * progress and ranks, and a Stop button while it is active.
 *
 * A pressed Stop button says "Stopping…" and is marked aria-disabled (not `disabled`, which would take
 * keyboard focus away) from the click until the run is no longer active or gone, or the request fails.
 * That state lives here, by run key, so polls that arrive meanwhile only refresh the row's text.
 */
import { showErrorMessage } from '@jupyterlab/apputils';

import { el, IRow, setAttr, setClass, setShown, setText } from './dom';
import { count, duration, groupsText, loss, nodeText, pidsText } from './format';
import { NbtrainModel } from './model';
import { requestAPI } from './request';
import { IRun, IStopReply } from './types';
import { NotebookLink, Section } from './views';

export function runKey(run: IRun): string {
  return `${run.kernel_id}:${run.run_id ?? ''}`;
}

export class RunsView {
  constructor(
    private _model: NbtrainModel,
    private _open: (path: string) => void
  ) {}

  get node(): HTMLElement {
    return this._section.node;
  }

  update(): void {
    const runs = this._model.runs;
    const active = new Set(runs.filter(run => run.active).map(runKey));
    for (const key of this._stopping) {
      if (!active.has(key)) {
        this._stopping.delete(key); // stopped, or gone from the list: nothing left to wait for
      }
    }
    this._section.update('Training runs', runs, 'No %%distributed run in this server’s kernels.');
  }

  isStopping(run: IRun): boolean {
    return this._stopping.has(runKey(run));
  }

  /** Ask the server to interrupt the run's kernel; the row says "Stopping…" until the run ends. */
  async stop(run: IRun): Promise<void> {
    const key = runKey(run);
    if (this._stopping.has(key)) {
      return;
    }
    this._stopping.add(key);
    this.update();
    try {
      await requestAPI<IStopReply>('stop', { method: 'POST', body: JSON.stringify({ kernel_id: run.kernel_id }) });
    } catch (error) {
      this._stopping.delete(key);
      this.update();
      await showErrorMessage('nbtrain could not stop the run', (error as Error).message);
    }
    await this._model.refresh();
  }

  private _stopping = new Set<string>();
  private _section = new Section<IRun>('nbtrain-Runs', runKey, () => new RunRow(this._model, this, this._open));
}

class RunRow implements IRow<IRun> {
  readonly node = el('div', 'nbtrain-Run');

  constructor(
    private _model: NbtrainModel,
    private _runs: RunsView,
    open: (path: string) => void
  ) {
    this._link = new NotebookLink(open);
    this._stop.title = 'Interrupt this kernel: every rank stops within a few seconds';
    this._stop.onclick = () => {
      if (this._run) {
        void this._runs.stop(this._run);
      }
    };
    const head = el('div', 'nbtrain-Run-head');
    head.append(this._link.node, this._state, this._stop);
    this.node.append(head, this._facts, this._pids, this._nodes, this._groups, this._summary);
  }

  update(run: IRun): void {
    this._run = run;
    setClass(this.node, `nbtrain-Run nbtrain-Run-${run.state}`);
    setAttr(this.node, 'data-kernel-id', run.kernel_id);
    this._link.update(run.path, run.kernel_id);
    setClass(this._state, `nbtrain-State nbtrain-State-${run.state}`);
    setText(this._state, run.state);
    this._updateStop(run);
    setText(this._facts, this._factsText(run));
    setText(this._pids, pidsText(run));
    setShown(this._nodes, run.nodes.length > 0);
    setText(this._nodes, run.nodes.map(nodeText).join('\n'));
    const groups = run.replica_groups ?? []; // a kernel of an older nbtrain writes none
    setShown(this._groups, groups.length > 0);
    setText(this._groups, groups.length ? groupsText(groups) : '');
    setShown(this._summary, Boolean(run.summary) && !run.active);
    setText(this._summary, run.active ? '' : (run.summary ?? ''));
  }

  private _updateStop(run: IRun): void {
    const stopping = this._runs.isStopping(run);
    // A background run is stopped from its notebook (run.stop()): interrupting the kernel does not reach it.
    setShown(this._stop, run.active && !run.background);
    setText(this._state, run.background ? `${run.state} · background run ${run.background}` : run.state);
    setText(this._stop, stopping ? 'Stopping…' : 'Stop');
    setAttr(this._stop, 'aria-disabled', stopping ? 'true' : null);
    this._stop.classList.toggle('nbtrain-mod-stopping', stopping);
  }

  private _factsText(run: IRun): string {
    const devices = [...new Set(run.ranks.map(r => r.device ?? '?'))].join(', ');
    const facts = [
      `${count('rank', run.nprocs ?? run.ranks.length)} on ${devices || run.device_type || '?'}`,
      `step ${run.step ?? '–'}`,
      `loss ${loss(run.loss)}`
    ];
    const now = this._model.machine?.time;
    const summarised = Boolean(run.summary) && !run.active; // the summary under the facts says how long it took
    if (run.started && (run.ended || now) && !summarised) {
      facts.push(duration((run.ended ?? now ?? run.started) - run.started));
    }
    return facts.join(' · ');
  }

  private _link: NotebookLink;
  private _run: IRun | null = null;
  private _state = el('span', 'nbtrain-State');
  private _stop = el('button', 'jp-Button jp-mod-styled jp-mod-warn nbtrain-Stop');
  private _facts = el('div', 'nbtrain-Run-facts');
  private _pids = el('div', 'nbtrain-Run-pids');
  private _nodes = el('div', 'nbtrain-Run-nodes');
  private _groups = el('div', 'nbtrain-Run-groups');
  private _summary = el('div', 'nbtrain-Run-summary');
}
