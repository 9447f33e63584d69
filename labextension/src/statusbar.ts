/**
 * The status bar item: "GPU0 73% · 41/80 GiB" (or "CPU 12% · RAM 5/24 GiB"); a click opens the panel.
 */
import { Widget } from '@lumino/widgets';

import { gib, percent, statusText } from './format';
import { NbtrainModel } from './model';

export class NbtrainStatus extends Widget {
  constructor(
    private _model: NbtrainModel,
    onClick: () => void
  ) {
    super();
    this.id = 'nbtrain-status';
    this.addClass('nbtrain-StatusItem');
    this.addClass('jp-StatusBar-TextItem');
    this.node.onclick = onClick;
    this._model.changed.connect(this._update, this);
    this._update();
  }

  dispose(): void {
    this._model.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _update(): void {
    const machine = this._model.machine;
    this.node.textContent = statusText(machine);
    const lines = machine
      ? machine.gpus.map(
          g => `GPU${g.index} ${g.name}: ${percent(g.utilization)}, ${gib(g.memory_used)}/${gib(g.memory_total)} GiB`
        )
      : [];
    const active = this._model.runs.filter(r => r.active).length;
    lines.push(`${active} nbtrain run${active === 1 ? '' : 's'} active — click for details`);
    const error = this._model.error;
    if (error) {
      // Keep the last numbers visible but mark them as old, and say why.
      lines.unshift(`Not updating: ${error}`);
    }
    this.node.classList.toggle('nbtrain-mod-stale', error !== null);
    this.node.title = lines.join('\n');
  }
}
