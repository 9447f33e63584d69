/**
 * nbtrain's JupyterLab extension: a GPU status bar item and a sidebar of GPUs, training runs and the
 * notebooks that hold each GPU. Data comes from nbtrain's server extension (nbtrain/server). It also brings
 * a run's dashboard back into a notebook reopened during the run (see reattach.ts).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { followHere } from './follow';
import { NbtrainModel } from './model';
import { KernelPace } from './pace';
import { NbtrainPanel, PANEL_ID } from './panel';
import { Reattach } from './reattach';
import { NbtrainStatus } from './statusbar';

const PLUGIN_ID = 'nbtrain:plugin';

const gpuIcon = new LabIcon({
  name: 'nbtrain:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<path d="M7 7h10v10H7zM9 9v6h6V9zM9 2h2v4H9zm4 0h2v4h-2zM9 18h2v4H9zm4 0h2v4h-2zM2 9h4v2H2zm0 4h4v2H2zm16-4h4v2h-4zm0 4h4v2h-4z"/>' +
    '</g></svg>'
});

function readSettings(settings: ISettingRegistry.ISettings | null) {
  const interval = settings?.get('refreshInterval').composite as number | undefined;
  const history = settings?.get('historyLength').composite as number | undefined;
  return { intervalSeconds: interval ?? 2, historyLength: history ?? 60 };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU status bar and a panel of GPUs, nbtrain runs and GPU processes by notebook.',
  autoStart: true,
  optional: [IStatusBar, ISettingRegistry],
  // The front end's own shell, not ILabShell: Notebook 7 has the same areas and calls, and no ILabShell.
  activate: async (app: JupyterFrontEnd, statusBar: IStatusBar | null, settingRegistry: ISettingRegistry | null) => {
    const shell = app.shell;
    let settings: ISettingRegistry.ISettings | null = null;
    if (settingRegistry) {
      try {
        settings = await settingRegistry.load(PLUGIN_ID);
      } catch (error) {
        console.warn('nbtrain: settings could not be loaded; using defaults', error);
      }
    }
    const model = new NbtrainModel(readSettings(settings));
    settings?.changed.connect(() => model.configure(readSettings(settings)));

    const panel = new NbtrainPanel(model, {
      open: path => void app.commands.execute('docmanager:open', { path }),
      follow: runId => followHere(app, shell, runId)
    });
    panel.title.icon = gpuIcon;
    shell.add(panel, 'right', { rank: 900 });
    app.docRegistry.addWidgetExtension('Notebook', new Reattach());
    app.docRegistry.addWidgetExtension('Notebook', new KernelPace(model));

    if (statusBar) {
      const item = new NbtrainStatus(model, () => shell.activateById(PANEL_ID));
      statusBar.registerStatusItem(PLUGIN_ID, { item, align: 'left', rank: 50 });
    }
  }
};

export default plugin;
