/**
 * The panel's device section: each GPU's load and memory now and as a short history, who holds it (every
 * user's nbtrain runs on the machine lease the GPUs they use) and who waits for GPUs, or the CPU and RAM on a
 * machine without a usable GPU. Rows are keyed by GPU uuid (index when the driver gives none).
 */
import { showErrorMessage } from '@jupyterlab/apputils';

import { el, IRow, setAttr, setClass, setShown, setText } from './dom';
import { count, gib, leaseText, percent, queueText } from './format';
import { NbtrainModel } from './model';
import { requestAPI } from './request';
import { createSparkline, drawSparkline } from './sparkline';
import { IReleaseReply } from './types';
import { Section } from './views';

interface IDeviceItem {
  key: string;
  className: string;
  name: string;
  now: string;
  historyKey: string;
  holders: string[];
  /** This user's idle warm ranks lease it: the row offers to give it back (the GPU's index), else null. */
  releasable: number | null;
}

export class DevicesView {
  constructor(private _model: NbtrainModel) {}

  get node(): HTMLElement {
    return this._section.node;
  }

  update(): void {
    const machine = this._model.machine;
    const cpuOnly = machine !== null && machine.gpus.length === 0;
    const note = this._section.note;
    const queue = machine ? queueText(machine.queue ?? []) : '';
    const leaseError = machine?.lease_error ?? '';
    setShown(note, cpuOnly || queue !== '' || leaseError !== '');
    if (cpuOnly) {
      setText(note, 'No NVIDIA GPU visible: showing CPU and RAM.');
      setAttr(note, 'title', machine.gpu_error ?? '');
    } else {
      setText(note, [queue, leaseError && `GPU leases not read: ${leaseError}`].filter(Boolean).join(' · '));
      setAttr(note, 'title', null);
    }
    this._section.update(cpuOnly ? 'CPU and memory' : 'GPUs', this._items(), 'Waiting for the server…');
  }

  private _items(): IDeviceItem[] {
    const machine = this._model.machine;
    if (!machine) {
      return [];
    }
    if (machine.gpus.length === 0) {
      const { cpu, ram } = machine;
      const now = `${percent(cpu.percent)} · RAM ${gib(ram.used)}/${gib(ram.total)} GiB`;
      const name = `CPU (${count('core', cpu.count)})`;
      return [{ key: 'cpu', className: 'nbtrain-Device-cpu', name, now, historyKey: 'cpu', holders: [], releasable: null }];
    }
    return machine.gpus.map(gpu => {
      const temperature = gpu.temperature === null ? '' : ` · ${gpu.temperature} °C`;
      return {
        key: `gpu:${gpu.uuid || gpu.index}`,
        className: `nbtrain-Device-gpu${gpu.index}`,
        name: `GPU${gpu.index} ${gpu.name}`,
        now: `${percent(gpu.utilization)} · ${gib(gpu.memory_used)}/${gib(gpu.memory_total)} GiB${temperature}`,
        historyKey: `gpu${gpu.index}`,
        holders: (machine.leases ?? []).filter(lease => lease.gpu === gpu.index).map(leaseText),
        releasable: (machine.leases ?? []).some(l => l.gpu === gpu.index && l.mine && l.state === 'idle-warm') ? gpu.index : null
      };
    });
  }

  private _section = new Section<IDeviceItem>(
    'nbtrain-Devices',
    item => item.key,
    () => new DeviceRow(this._model)
  );
}

class DeviceRow implements IRow<IDeviceItem> {
  readonly node = el('div', 'nbtrain-Device');

  constructor(private _model: NbtrainModel) {
    const head = el('div', 'nbtrain-Device-head');
    head.append(this._name, this._now);
    const charts = el('div', 'nbtrain-Device-charts');
    const loadBox = el('div', 'nbtrain-Chart', 'load');
    loadBox.appendChild(this._load);
    const memoryBox = el('div', 'nbtrain-Chart', 'memory');
    memoryBox.appendChild(this._memory);
    charts.append(loadBox, memoryBox);
    const lease = el('div', 'nbtrain-Device-leaseRow');
    lease.append(this._holders, this._release);
    this.node.append(head, lease, charts);
    setText(this._release, 'Give back');
    setAttr(this._release, 'title', 'Stop the idle warm ranks that hold this GPU (%distributed_shutdown in their kernel)');
    this._release.onclick = () => void this._giveBack();
  }

  /** Ask the server to stop this user's idle warm ranks on the GPU; a refusal is said, with why. */
  private async _giveBack(): Promise<void> {
    const gpu = this._releasable;
    if (gpu === null) {
      return;
    }
    setText(this._release, 'Giving back…');
    try {
      await requestAPI<IReleaseReply>('leases/release', { method: 'POST', body: JSON.stringify({ gpu }) });
    } catch (error) {
      await showErrorMessage('nbtrain could not give the GPU back', (error as Error).message);
    }
    setText(this._release, 'Give back');
    await this._model.refresh();
  }

  update(item: IDeviceItem): void {
    setClass(this.node, `nbtrain-Device ${item.className}`);
    setText(this._name, item.name);
    setText(this._now, item.now);
    setText(this._holders, item.holders.length ? `leased: ${item.holders.join('; ')}` : '');
    setShown(this._holders, item.holders.length > 0);
    this._releasable = item.releasable;
    setShown(this._release, item.releasable !== null);
    const history = this._model.history(item.historyKey);
    drawSparkline(this._load, history.load, this._model.historyLength);
    drawSparkline(this._memory, history.memory, this._model.historyLength);
  }

  private _name = el('span', 'nbtrain-Device-name');
  private _now = el('span', 'nbtrain-Device-now');
  private _holders = el('div', 'nbtrain-Device-lease');
  private _release = el('button', 'jp-Button jp-mod-styled nbtrain-Release');
  private _releasable: number | null = null;
  private _load = createSparkline('nbtrain-Sparkline-load');
  private _memory = createSparkline('nbtrain-Sparkline-memory');
}
