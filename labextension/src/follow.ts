/**
 * "Follow here" for a detached run whose notebook is gone (moved, deleted): a cell that attaches to the run is
 * added to the notebook in front — or to a new notebook when none is — and run there. The cell is Python
 * (`nbtrain.attach("<run id>")`), which loads nbtrain's extension itself in a kernel that has not.
 *
 * The notebook is reached through JupyterLab's commands and the few members of its panel used here, so the
 * extension needs no build-time dependency on @jupyterlab/notebook.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { Widget } from '@lumino/widgets';

interface ICellLike {
  model: { sharedModel: { getSource(): string; setSource(source: string): void } };
}

interface INotebookLike extends Widget {
  content: { activeCell: ICellLike | null };
  context: { ready: Promise<void> };
  sessionContext: { ready: Promise<void> };
}

function isNotebook(widget: Widget | null | undefined): widget is INotebookLike {
  const candidate = widget as Partial<INotebookLike> | null | undefined;
  return Boolean(candidate?.content && candidate.context && candidate.sessionContext && 'activeCell' in candidate.content);
}

/** The cell that follows run `runId`. */
export function followCode(runId: string): string {
  return `import nbtrain\nnbtrain.attach(${JSON.stringify(runId)})`;
}

/** Add the cell that follows `runId` to the notebook in front (a new one if none is) and run it. */
export async function followHere(app: JupyterFrontEnd, shell: JupyterFrontEnd.IShell, runId: string): Promise<void> {
  let notebook: Widget | null | undefined = shell.currentWidget;
  if (!isNotebook(notebook)) {
    notebook = (await app.commands.execute('notebook:create-new', { kernelName: 'python3' })) as Widget;
  }
  if (!isNotebook(notebook)) {
    throw new Error('JupyterLab opened no notebook to follow the run from');
  }
  await notebook.context.ready;
  shell.activateById(notebook.id);
  const active = notebook.content.activeCell;
  if (!active || active.model.sharedModel.getSource().trim() !== '') {
    await app.commands.execute('notebook:insert-cell-below');
  }
  notebook.content.activeCell?.model.sharedModel.setSource(followCode(runId));
  await notebook.sessionContext.ready;
  await app.commands.execute('notebook:run-cell');
}
