/**
 * The panel's detached runs: this user's `--detach` runs on this machine, which may have outlived the kernel
 * that started them. Each row says the run's id, state, step and ranks, the notebook that started it (a click
 * opens it), the line that follows it from any notebook (`%distributed_attach <id>`), and has a Stop button
 * while it runs: the server asks the run's agent to stop it (POST /nbtrain/detached/stop). When that notebook is
 * gone, "Follow here" runs the attach in the notebook in front instead (follow.ts).
 *
 * A pressed Stop says "Stopping…" until the run is no longer running, as the runs' Stop does (runs.ts).
 */
import { showErrorMessage } from '@jupyterlab/apputils';

import { el, IRow, setAttr, setClass, setShown, setText } from './dom';
import { clock, count, duration } from './format';
import { NbtrainModel } from './model';
import { requestAPI } from './request';
import { IDetachedRun, IDetachedStopReply } from './types';
import { NotebookLink, Section } from './views';

export class DetachedView {
  constructor(
    private _model: NbtrainModel,
    private _open: (path: string) => void,
    private _follow: (runId: string) => Promise<void>
  ) {}

  get node(): HTMLElement {
    return this._section.node;
  }

  update(): void {
    const runs = this._model.detached;
    const running = new Set(runs.filter(run => run.active).map(run => run.run_id));
    for (const id of this._stopping) {
      if (!running.has(id)) {
        this._stopping.delete(id);
      }
    }
    setShown(this._section.node, runs.length > 0); // most users never detach a run: no empty section for them
    this._section.update('Detached runs', runs, '');
  }

  isStopping(run: IDetachedRun): boolean {
    return this._stopping.has(run.run_id);
  }

  async stop(run: IDetachedRun): Promise<void> {
    if (this._stopping.has(run.run_id)) {
      return;
    }
    this._stopping.add(run.run_id);
    this.update();
    try {
      await requestAPI<IDetachedStopReply>('detached/stop', {
        method: 'POST',
        body: JSON.stringify({ run_id: run.run_id })
      });
    } catch (error) {
      this._stopping.delete(run.run_id);
      this.update();
      await showErrorMessage('nbtrain could not stop the detached run', (error as Error).message);
    }
    await this._model.refresh();
  }

  async follow(run: IDetachedRun): Promise<void> {
    try {
      await this._follow(run.run_id);
    } catch (error) {
      await showErrorMessage('nbtrain could not follow the detached run here', (error as Error).message);
    }
  }

  private _stopping = new Set<string>();
  private _section = new Section<IDetachedRun>(
    'nbtrain-Detached',
    run => run.run_id,
    () => new DetachedRow(this._model, this, this._open)
  );
}

class DetachedRow implements IRow<IDetachedRun> {
  readonly node = el('div', 'nbtrain-Run nbtrain-DetachedRun');

  constructor(
    private _model: NbtrainModel,
    private _view: DetachedView,
    open: (path: string) => void
  ) {
    this._link = new NotebookLink(open);
    this._stop.title = "Stop this run: its agent interrupts the ranks, which stop within a few seconds";
    this._stop.onclick = () => {
      if (this._run) {
        void this._view.stop(this._run);
      }
    };
    this._followHere.title = "Its notebook is gone: follow the run from the notebook in front (a new one if none is)";
    this._followHere.onclick = () => {
      if (this._run) {
        void this._view.follow(this._run);
      }
    };
    const head = el('div', 'nbtrain-Run-head');
    head.append(this._id, this._state, this._stop);
    this.node.append(head, this._facts, this._link.node, this._attach, this._followHere);
  }

  update(run: IDetachedRun): void {
    this._run = run;
    setAttr(this.node, 'data-run-id', run.run_id);
    setText(this._id, run.run_id);
    setClass(this._state, `nbtrain-State nbtrain-State-${run.state}`);
    setText(this._state, run.state);
    const stopping = this._view.isStopping(run);
    setShown(this._stop, run.active);
    setText(this._stop, stopping ? 'Stopping…' : 'Stop');
    setAttr(this._stop, 'aria-disabled', stopping ? 'true' : null);
    const now = this._model.machine?.time ?? run.started;
    const facts = [count('rank', run.nprocs), `step ${run.step ?? '–'}`, `started ${clock(run.started)}`,
                   duration((run.ended ?? now) - run.started)];
    setText(this._facts, facts.join(' · '));
    setShown(this._link.node, Boolean(run.notebook) && !run.notebook_gone);
    this._link.update(run.notebook, run.run_id);
    setShown(this._followHere, run.notebook_gone);
    setText(this._attach, run.attach);
    setAttr(this._attach, 'title', 'Run this line in any notebook of yours to follow the run there');
  }

  private _run: IDetachedRun | null = null;
  private _link: NotebookLink;
  private _id = el('span', 'nbtrain-DetachedRun-id');
  private _state = el('span', 'nbtrain-State');
  private _stop = el('button', 'jp-Button jp-mod-styled jp-mod-warn nbtrain-Stop');
  private _facts = el('div', 'nbtrain-Run-facts');
  private _attach = el('code', 'nbtrain-DetachedRun-attach');
  private _followHere = el('button', 'jp-Button jp-mod-styled nbtrain-DetachedRun-follow', 'Follow here');
}
