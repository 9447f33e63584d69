/**
 * The pace of the status bar's polls follows the notebooks' kernels: each notebook's kernel tells the model when
 * it turns busy or idle, so the badge and the panel catch a cell's start and end at once instead of at the next
 * tick of the idle interval (up to two seconds later by default).
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { DocumentRegistry } from '@jupyterlab/docregistry';
import type { IDisposable } from '@lumino/disposable';
import type { Widget } from '@lumino/widgets';

import type { NbtrainModel } from './model';

let opened = 0; // each notebook's key in the model's set of busy kernels

export class KernelPace implements DocumentRegistry.IWidgetExtension<Widget, DocumentRegistry.IModel> {
  constructor(private _model: NbtrainModel) {}

  createNew(_widget: Widget, context: DocumentRegistry.IContext<DocumentRegistry.IModel>): IDisposable {
    const key = `notebook-${++opened}`;
    const onStatus = (session: ISessionContext) => this._model.kernelBusy(key, session.kernelDisplayStatus === 'busy');
    context.sessionContext.statusChanged.connect(onStatus);
    let disposed = false;
    return {
      get isDisposed() {
        return disposed;
      },
      dispose: () => {
        context.sessionContext.statusChanged.disconnect(onStatus);
        this._model.kernelBusy(key, false);
        disposed = true;
      }
    };
  }
}
