/**
 * A run's dashboard in a page that did not start the run: a page reloaded during a run, a notebook reopened.
 *
 * The kernel's main thread runs the cell, so a page that connects meanwhile gets no answer from it, and its
 * notebook ignores the outputs of an execution it did not request. nbtrain's kernel side
 * (nbtrain/kernel/dashboard/reopen.py) marks each dashboard output with its cell and role
 * (`metadata.nbtrain = {cell, role}`); this extension:
 *
 * - puts such an output, when another page's execution published it, into the cell with that id, in place of
 *   the cell's output of the same role: the final picture and the summary reach the cell (and, saved, the
 *   .ipynb) whatever happened to the page that ran the cell;
 * - when the page opens a notebook whose kernel is busy (its kernel info does not come), asks the kernel, on
 *   a subshell (JEP 91) since the main shell is busy, to show its live dashboards again: the kernel resends
 *   the widgets' state and the dashboard's output, which the first point puts into the cell;
 * - when the kernel is idle, asks the same on the main shell: the final picture and summary of the latest runs
 *   that ended (a background run, a cell whose page was closed) reach their cells, and the saved .ipynb.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { DocumentRegistry } from '@jupyterlab/docregistry';
import { KernelMessage } from '@jupyterlab/services';
import type { Kernel } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import type { Widget } from '@lumino/widgets';

/** How long a connected kernel may take to answer its kernel info before it counts as busy. */
const BUSY_AFTER_MS = 1500;
const SUBSHELL_TIMEOUT_MS = 5000;
// Run on the subshell; a kernel that never loaded nbtrain imports nothing.
const SHOW_AGAIN = [
  'import sys as _nbtrain_sys',
  '_nbtrain_reopen = _nbtrain_sys.modules.get("nbtrain.kernel.dashboard.reopen")',
  'if _nbtrain_reopen is not None: _nbtrain_reopen.show_again()',
  'del _nbtrain_sys, _nbtrain_reopen'
].join('\n');

// What the dashboard's outputs hold; anything else in a marked output is left out (no HTML, no script).
const ADOPTED_TYPES = ['application/vnd.jupyter.widget-view+json', 'image/png', 'text/markdown', 'text/plain'];

interface INbtrainTag {
  cell: string;
  role: string;
  request?: string | null; // the cell's execute request, whose other outputs follow the dashboard's into the cell
  count?: number | null; // its execution count, the cell's prompt once the request is done
}

/** The few members of a notebook's model used here (the notebook package is not a dependency). */
interface IOutputJSON {
  output_type: string;
  data?: unknown;
  metadata?: { nbtrain?: INbtrainTag };
}
interface IOutputList {
  readonly length: number;
  get(index: number): { toJSON(): IOutputJSON };
  set(index: number, output: IOutputJSON): void;
  add(output: IOutputJSON): number;
}
interface ICell {
  id: string;
  outputs?: IOutputList;
  executionCount?: number | null;
}
interface ICells {
  readonly length: number;
  get(index: number): ICell;
}
/** Requests another page sent, followed here since their dashboard was adopted: request id -> its tag. */
export type Followed = Map<string, INbtrainTag>;

export class Reattach implements DocumentRegistry.IWidgetExtension<Widget, DocumentRegistry.IModel> {
  createNew(_widget: Widget, context: DocumentRegistry.IContext<DocumentRegistry.IModel>): IDisposable {
    const session = context.sessionContext;
    const cells = () => (context.model as unknown as { cells?: ICells }).cells;
    const followed: Followed = new Map();
    const onMessage = (sender: ISessionContext, msg: KernelMessage.IMessage) => {
      adopt(cells(), sender.session?.kernel ?? null, msg, followed);
    };
    const onKernel = () => void showAgain(session.session?.kernel ?? null);
    session.iopubMessage.connect(onMessage);
    session.kernelChanged.connect(onKernel);
    void session.ready.then(onKernel);
    let disposed = false;
    return {
      get isDisposed() {
        return disposed;
      },
      dispose() {
        session.iopubMessage.disconnect(onMessage);
        session.kernelChanged.disconnect(onKernel);
        disposed = true;
      }
    };
  }
}

/**
 * Put a marked dashboard output that another page's execution published into its cell; then follow that execution
 * (`followed`): its other outputs (rank 0's prints, nbtrain's closing lines, a traceback) go into the cell too, and
 * when the kernel says it is done the cell gets its execution count — the page that sent it, gone, would have.
 */
export function adopt(
  cells: ICells | undefined,
  kernel: Kernel.IKernelConnection | null,
  msg: KernelMessage.IMessage,
  followed: Followed = new Map()
): void {
  const type = msg.header.msg_type;
  const parent = msg.parent_header as Partial<KernelMessage.IHeader>;
  if (!cells || !kernel || parent.session === kernel.clientId) {
    return; // this page's own execution: its output area shows it already
  }
  const following = parent.msg_id ? followed.get(parent.msg_id) : undefined;
  if (following) {
    follow(cells, following, msg, () => followed.delete(parent.msg_id as string));
  }
  if (type !== 'display_data' && type !== 'update_display_data') {
    return;
  }
  const content = msg.content as { data: Record<string, unknown>; metadata?: { nbtrain?: INbtrainTag } };
  const tag = content.metadata?.nbtrain;
  if (!tag) {
    return; // not nbtrain's (followed above if its request is)
  }
  const cell = findCell(cells, tag.cell);
  if (cell?.outputs) {
    const data = Object.fromEntries(Object.entries(content.data ?? {}).filter(([type]) => ADOPTED_TYPES.includes(type)));
    replaceRole(cell.outputs, { output_type: 'display_data', data, metadata: content.metadata });
    if (tag.request && !followed.has(tag.request)) {
      followed.set(tag.request, tag);
    }
  }
}

function findCell(cells: ICells, id: string): ICell | undefined {
  for (let i = 0; i < cells.length; i++) {
    if (cells.get(i).id === id) {
      return cells.get(i);
    }
  }
  return undefined;
}

/** One more message of a followed request: a stream, a result or an error into its cell; the end, its count. */
function follow(cells: ICells, tag: INbtrainTag, msg: KernelMessage.IMessage, done: () => void): void {
  const cell = findCell(cells, tag.cell);
  const outputs = cell?.outputs;
  if (!cell || !outputs) {
    return;
  }
  const type = msg.header.msg_type;
  const content = msg.content as Record<string, unknown>;
  if (type === 'stream') {
    const last = outputs.length ? outputs.get(outputs.length - 1).toJSON() : null;
    const name = content.name as string;
    const text = String(content.text ?? '');
    if (last && last.output_type === 'stream' && (last as { name?: string }).name === name) {
      const before = (last as { text?: string | string[] }).text ?? '';
      outputs.set(outputs.length - 1, { output_type: 'stream', name, text: [before].flat().join('') + text } as IOutputJSON);
    } else {
      outputs.add({ output_type: 'stream', name, text } as IOutputJSON);
    }
  } else if (type === 'error') {
    outputs.add({ output_type: 'error', ...content } as IOutputJSON);
  } else if (type === 'execute_result') {
    outputs.add({ output_type: 'execute_result', ...content } as IOutputJSON);
  } else if (type === 'display_data' && !(content.metadata as { nbtrain?: unknown } | undefined)?.nbtrain) {
    outputs.add({ output_type: 'display_data', data: content.data } as IOutputJSON);
  } else if (type === 'status' && content.execution_state === 'idle') {
    if (typeof tag.count === 'number') {
      cell.executionCount = tag.count;
    }
    done();
  }
}

function replaceRole(outputs: IOutputList, output: IOutputJSON): void {
  const role = output.metadata?.nbtrain?.role;
  for (let i = 0; i < outputs.length; i++) {
    const held = outputs.get(i).toJSON();
    if (held.metadata?.nbtrain?.role === role) {
      if (JSON.stringify(held.data) !== JSON.stringify(output.data)) {
        outputs.set(i, output); // the same picture again (a notebook reopened) leaves the notebook unchanged
      }
      return;
    }
  }
  outputs.add(output);
}

// Kernels this page asked, by id: JupyterLab may hand the page a new connection to the same kernel later (its
// kernel info then waits behind a running cell, and the run's own page would ask for its own dashboard again).
const asked = new Set<string>();

/**
 * Ask a kernel the page just connected to for what this page never saw: a busy kernel may be running a dashboard
 * (asked on a subshell, since the main shell is busy); an idle one may hold the final picture of a run that ended
 * while no page had the notebook open (asked on the main shell, from a connection of its own so that the
 * answer counts as another page's).
 */
async function showAgain(kernel: Kernel.IKernelConnection | null): Promise<void> {
  if (!kernel || asked.has(kernel.id)) {
    return;
  }
  asked.add(kernel.id);
  // Each loser of a race still settles later: its rejection (the kernel restarted, the page closed) is caught here,
  // or the page logs it as an uncaught error.
  const busy = await Promise.race([kernel.info.then(() => false, () => false), after(BUSY_AFTER_MS, true)]);
  if (kernel.isDisposed) {
    return;
  }
  try {
    const subshellId = busy ? await newSubshell(kernel) : null;
    if (busy && !subshellId) {
      return; // a kernel without subshells: nothing to ask it while it is busy
    }
    // The subshell stays: replies to the widgets' messages are routed to it from now on.
    // clone() passes every connection option on (services 7.4+), though its type names three of them.
    const options = (subshellId ? { subshellId } : {}) as unknown as Parameters<Kernel.IKernelConnection['clone']>[0];
    const side = kernel.clone(options);
    try {
      await side.requestExecute({ code: SHOW_AGAIN, silent: true, store_history: false, allow_stdin: false }).done;
    } finally {
      side.dispose();
    }
  } catch (error) {
    console.warn('nbtrain: could not ask the kernel for its dashboards', error);
  }
}

async function newSubshell(kernel: Kernel.IKernelConnection): Promise<string | null> {
  const created = await Promise.race([createSubshell(kernel).catch(() => null), after(SUBSHELL_TIMEOUT_MS, null)]);
  return created?.content.status === 'ok' ? (created.content.subshell_id ?? null) : null;
}

/**
 * A subshell, asked for on the control channel. Not `requestCreateSubshell`: that waits to learn from the kernel
 * info whether the kernel has subshells, and the kernel info waits behind the busy main shell.
 */
async function createSubshell(kernel: Kernel.IKernelConnection): Promise<{ content: { status: string; subshell_id?: string } }> {
  const msg = KernelMessage.createMessage({
    msgType: 'create_subshell_request',
    channel: 'control',
    username: kernel.username,
    session: kernel.clientId,
    content: {}
  });
  const reply = await kernel.sendControlMessage(msg, true, true).done;
  return reply as unknown as { content: { status: string; subshell_id?: string } };
}

function after<T>(ms: number, value: T): Promise<T> {
  return new Promise(resolve => setTimeout(() => resolve(value), ms));
}
