/**
 * The panel's GPU processes, grouped by the notebook (kernel) they belong to; processes outside this
 * server's kernels form one group of their own. Groups are keyed by kernel id, processes by GPU and pid.
 */
import { el, IRow, setShown, setText, syncList } from './dom';
import { gib } from './format';
import { NbtrainModel } from './model';
import { IProcess } from './types';
import { NotebookLink, Section } from './views';

interface IProcessGroup {
  kernelId: string; // '' for processes of no kernel of this server
  members: IProcess[];
}

export class ProcessesView {
  constructor(
    private _model: NbtrainModel,
    private _open: (path: string) => void
  ) {}

  get node(): HTMLElement {
    return this._section.node;
  }

  update(): void {
    const groups = new Map<string, IProcess[]>();
    for (const proc of this._model.processes) {
      const key = proc.kernel_id ?? '';
      groups.set(key, [...(groups.get(key) ?? []), proc]);
    }
    const items = [...groups].map(([kernelId, members]) => ({ kernelId, members }));
    // processes === null: the driver does not list them (VMs, some containers) — unknown, not "none".
    const unlisted = (this._model.machine?.gpus ?? []).filter(gpu => gpu.processes === null).map(gpu => `GPU${gpu.index}`);
    const empty = unlisted.length
      ? `Processes unknown on ${unlisted.join(', ')}: the driver does not list them; memory.used above is what is in use.`
      : 'No process is using a GPU.';
    this._section.update('GPU processes by notebook', items, empty);
    // A machine without a GPU has no GPU processes to list: the section would only say so.
    setShown(this._section.node, this._model.machine === null || this._model.machine.gpus.length > 0);
  }

  private _section = new Section<IProcessGroup>(
    'nbtrain-Processes',
    group => group.kernelId,
    group => new GroupRow(group.kernelId, this._open)
  );
}

class GroupRow implements IRow<IProcessGroup> {
  readonly node = el('div', 'nbtrain-ProcessGroup');

  constructor(kernelId: string, open: (path: string) => void) {
    this._link = kernelId ? new NotebookLink(open) : null;
    const head = el('div', 'nbtrain-ProcessGroup-head');
    head.append(this._link?.node ?? el('span', 'nbtrain-Other', 'Not a kernel of this server'), this._memory);
    this.node.append(head, this._list);
  }

  update(group: IProcessGroup): void {
    const { kernelId, members } = group;
    this._link?.update(members[0].path, kernelId);
    const total = members.reduce((sum, p) => sum + (p.memory_used ?? 0), 0);
    setText(this._memory, `${gib(total)} GiB`);
    syncList(this._list, this._processes, members, p => `${p.gpu_index}:${p.pid}`, () => new ProcessLine(kernelId));
  }

  private _link: NotebookLink | null;
  private _memory = el('span', 'nbtrain-ProcessGroup-memory');
  private _list = el('div', 'nbtrain-ProcessGroup-processes');
  private _processes = new Map<string, IRow<IProcess>>();
}

class ProcessLine implements IRow<IProcess> {
  readonly node = el('div', 'nbtrain-Process');

  constructor(private _kernelId: string) {}

  update(proc: IProcess): void {
    const who = proc.rank !== null ? `rank ${proc.rank}` : (proc.process_name ?? '?');
    const user = this._kernelId || !proc.user ? '' : ` · ${proc.user}`;
    setText(this.node, `GPU${proc.gpu_index} · pid ${proc.pid} · ${who}${user} · ${gib(proc.memory_used)} GiB`);
  }
}
