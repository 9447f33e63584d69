/**
 * The nbtrain sidebar: each GPU's load and memory history, the training runs with a stop button, this user's
 * detached runs, and the GPU processes grouped by the notebook they belong to.
 *
 * Its nodes are made once; every poll updates them in place (see dom.ts for why). Each section is its own
 * view: devices.ts, runs.ts, detached.ts, processes.ts.
 */
import { Widget } from '@lumino/widgets';

import { DetachedView } from './detached';
import { DevicesView } from './devices';
import { el, setShown, setText } from './dom';
import { NbtrainModel } from './model';
import { ProcessesView } from './processes';
import { RunsView } from './runs';

export const PANEL_ID = 'nbtrain-panel';

export interface IPanelActions {
  /** Open a notebook (or any file) by its server path. */
  open(path: string): void;
  /** Follow a detached run from the notebook in front (a new one if none is): see follow.ts. */
  follow(runId: string): Promise<void>;
}

export class NbtrainPanel extends Widget {
  constructor(
    private _model: NbtrainModel,
    actions: IPanelActions
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('nbtrain-Panel');
    this.title.caption = 'nbtrain: GPUs and training runs';
    const open = (path: string) => actions.open(path);
    this._devices = new DevicesView(_model);
    this._runs = new RunsView(_model, open);
    this._detached = new DetachedView(_model, open, runId => actions.follow(runId));
    this._processes = new ProcessesView(_model, open);
    this.node.append(
      el('h2', 'nbtrain-Panel-title', 'nbtrain'),
      this._error,
      this._devices.node,
      this._runs.node,
      this._detached.node,
      this._processes.node
    );
    this._model.changed.connect(this._update, this);
    this._update();
  }

  dispose(): void {
    this._model.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _update(): void {
    const error = this._model.error;
    setShown(this._error, error !== null);
    setText(this._error, error === null ? '' : `Server not answering: ${error}`);
    this._devices.update();
    this._runs.update();
    this._detached.update();
    this._processes.update();
  }

  private _error = el('div', 'nbtrain-Error');
  private _devices: DevicesView;
  private _runs: RunsView;
  private _detached: DetachedView;
  private _processes: ProcessesView;
}
