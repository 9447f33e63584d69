/**
 * The nbtrain sidebar: each GPU's load and memory history, the training runs with a stop button, and the
 * GPU processes grouped by the notebook they belong to.
 */
import { showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { count, duration, gib, loss, percent } from './format';
import { NbtrainModel } from './model';
import { requestAPI } from './request';
import { sparkline } from './sparkline';
import { IProcess, IRun } from './types';

export const PANEL_ID = 'nbtrain-panel';

export interface IPanelActions {
  /** Open a notebook (or any file) by its server path. */
  open(path: string): void;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export class NbtrainPanel extends Widget {
  constructor(
    private _model: NbtrainModel,
    private _actions: IPanelActions
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('nbtrain-Panel');
    this.title.caption = 'nbtrain: GPUs and training runs';
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const root = this.node;
    root.replaceChildren(el('h2', 'nbtrain-Panel-title', 'nbtrain'));
    if (this._model.error) {
      root.appendChild(el('div', 'nbtrain-Error', `Server not answering: ${this._model.error}`));
    }
    root.appendChild(this._devices());
    root.appendChild(this._runs());
    root.appendChild(this._processes());
  }

  private _section(title: string, className: string): HTMLElement {
    const section = el('section', `nbtrain-Section ${className}`);
    section.appendChild(el('h3', 'nbtrain-Section-title', title));
    return section;
  }

  private _devices(): HTMLElement {
    const machine = this._model.machine;
    const section = this._section(machine && machine.gpus.length === 0 ? 'CPU and memory' : 'GPUs', 'nbtrain-Devices');
    if (!machine) {
      section.appendChild(el('div', 'nbtrain-Empty', 'Waiting for the server…'));
      return section;
    }
    if (machine.gpus.length === 0) {
      const note = el('div', 'nbtrain-Note', 'No NVIDIA GPU visible: showing CPU and RAM.');
      note.title = machine.gpu_error ?? '';
      section.appendChild(note);
      const history = this._model.history('cpu');
      section.appendChild(
        this._device(
          'nbtrain-Device-cpu',
          `CPU (${count('core', machine.cpu.count)})`,
          `${percent(machine.cpu.percent)} · RAM ${gib(machine.ram.used)}/${gib(machine.ram.total)} GiB`,
          history.load,
          history.memory
        )
      );
    }
    for (const gpu of machine.gpus) {
      const history = this._model.history(`gpu${gpu.index}`);
      const temperature = gpu.temperature === null ? '' : ` · ${gpu.temperature} °C`;
      section.appendChild(
        this._device(
          `nbtrain-Device-gpu${gpu.index}`,
          `GPU${gpu.index} ${gpu.name}`,
          `${percent(gpu.utilization)} · ${gib(gpu.memory_used)}/${gib(gpu.memory_total)} GiB${temperature}`,
          history.load,
          history.memory
        )
      );
    }
    return section;
  }

  private _device(id: string, name: string, now: string, load: number[], memory: number[]): HTMLElement {
    const row = el('div', `nbtrain-Device ${id}`);
    const head = el('div', 'nbtrain-Device-head');
    head.appendChild(el('span', 'nbtrain-Device-name', name));
    head.appendChild(el('span', 'nbtrain-Device-now', now));
    row.appendChild(head);
    const charts = el('div', 'nbtrain-Device-charts');
    const capacity = this._model.historyLength;
    const loadBox = el('div', 'nbtrain-Chart', 'load');
    loadBox.appendChild(sparkline(load, capacity, 'nbtrain-Sparkline-load'));
    const memoryBox = el('div', 'nbtrain-Chart', 'memory');
    memoryBox.appendChild(sparkline(memory, capacity, 'nbtrain-Sparkline-memory'));
    charts.append(loadBox, memoryBox);
    row.appendChild(charts);
    return row;
  }

  private _runs(): HTMLElement {
    const section = this._section('Training runs', 'nbtrain-Runs');
    const runs = this._model.runs;
    if (runs.length === 0) {
      section.appendChild(el('div', 'nbtrain-Empty', 'No %%distributed run in this server’s kernels.'));
    }
    for (const run of runs) {
      section.appendChild(this._run(run));
    }
    return section;
  }

  private _run(run: IRun): HTMLElement {
    const row = el('div', `nbtrain-Run nbtrain-Run-${run.state}`);
    row.dataset.kernelId = run.kernel_id;
    const head = el('div', 'nbtrain-Run-head');
    head.appendChild(this._notebookLink(run.path, run.kernel_id));
    head.appendChild(el('span', `nbtrain-State nbtrain-State-${run.state}`, run.state));
    if (run.active) {
      const stop = el('button', 'jp-Button jp-mod-styled jp-mod-warn nbtrain-Stop', 'Stop');
      stop.title = 'Interrupt this kernel: every rank stops within a few seconds';
      stop.onclick = () => void this._stop(run, stop);
      head.appendChild(stop);
    }
    row.appendChild(head);
    const devices = [...new Set(run.ranks.map(r => r.device ?? '?'))].join(', ');
    const facts = [
      `${count('rank', run.nprocs ?? run.ranks.length)} on ${devices || run.device_type || '?'}`,
      `step ${run.step ?? '–'}`,
      `loss ${loss(run.loss)}`
    ];
    const now = this._model.machine?.time;
    if (run.started && (run.ended || now)) {
      facts.push(duration((run.ended ?? now ?? run.started) - run.started));
    }
    row.appendChild(el('div', 'nbtrain-Run-facts', facts.join(' · ')));
    const pids = run.ranks.map(r => `${r.rank}:${r.pid}${r.alive ? '' : ' (gone)'}`).join('  ');
    row.appendChild(el('div', 'nbtrain-Run-pids', `kernel ${run.kernel_pid ?? '?'} · ranks ${pids || '–'}`));
    if (run.summary && !run.active) {
      row.appendChild(el('div', 'nbtrain-Run-summary', run.summary));
    }
    return row;
  }

  private async _stop(run: IRun, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    button.textContent = 'Stopping…';
    try {
      await requestAPI('stop', { method: 'POST', body: JSON.stringify({ kernel_id: run.kernel_id }) });
    } catch (error) {
      await showErrorMessage('nbtrain could not stop the run', (error as Error).message);
    }
    await this._model.refresh();
  }

  private _processes(): HTMLElement {
    const section = this._section('GPU processes by notebook', 'nbtrain-Processes');
    const processes = this._model.processes;
    if (processes.length === 0) {
      section.appendChild(el('div', 'nbtrain-Empty', 'No process is using a GPU.'));
      return section;
    }
    const groups = new Map<string, IProcess[]>();
    for (const proc of processes) {
      const key = proc.kernel_id ?? '';
      groups.set(key, [...(groups.get(key) ?? []), proc]);
    }
    for (const [kernelId, members] of groups) {
      const group = el('div', 'nbtrain-ProcessGroup');
      const total = members.reduce((sum, p) => sum + (p.memory_used ?? 0), 0);
      const head = el('div', 'nbtrain-ProcessGroup-head');
      if (kernelId) {
        head.appendChild(this._notebookLink(members[0].path, kernelId));
      } else {
        head.appendChild(el('span', 'nbtrain-Other', 'Not a kernel of this server'));
      }
      head.appendChild(el('span', 'nbtrain-ProcessGroup-memory', `${gib(total)} GiB`));
      group.appendChild(head);
      for (const proc of members) {
        const who = proc.rank !== null ? `rank ${proc.rank}` : (proc.process_name ?? '?');
        const user = kernelId || !proc.user ? '' : ` · ${proc.user}`;
        group.appendChild(
          el('div', 'nbtrain-Process', `GPU${proc.gpu_index} · pid ${proc.pid} · ${who}${user} · ${gib(proc.memory_used)} GiB`)
        );
      }
      section.appendChild(group);
    }
    return section;
  }

  private _notebookLink(path: string | null, kernelId: string): HTMLElement {
    if (!path) {
      return el('span', 'nbtrain-Notebook', `kernel ${kernelId.slice(0, 8)}`);
    }
    const link = el('a', 'nbtrain-Notebook', path.split('/').pop() ?? path);
    link.title = `Open ${path}`;
    link.href = '#';
    link.onclick = event => {
      event.preventDefault();
      this._actions.open(path);
    };
    return link;
  }
}
