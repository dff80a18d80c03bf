// nbtrain's JupyterLab extension: the "Training runs" sidebar, a status-bar item, and %%finetune cells
// (YAML highlighting, config-key completion). All of it reads the server extension's REST API.
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICompletionProviderManager } from '@jupyterlab/completer';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { FinetuneCompletionProvider, highlightFinetuneCells } from './finetune';
import { RunsModel } from './model';
import { RunsStatus } from './statusbar';
import { RunsSidebar } from './sidebar';

const runsIcon = new LabIcon({
  name: 'nbtrain:runs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<path class="jp-icon3" fill="#616161" d="M3 20h18v2H3zM5 10h3v8H5zm5.5-6h3v14h-3zM16 7h3v11h-3z"/>' +
    '</svg>'
});

const runsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbtrain:runs',
  description: 'Sidebar and status bar for nbtrain training runs.',
  autoStart: true,
  requires: [ILabShell],
  optional: [INotebookTracker, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    tracker: INotebookTracker | null,
    statusBar: IStatusBar | null
  ) => {
    const model = new RunsModel();

    const openDashboard = async (runId: string): Promise<boolean> => {
      const panel = tracker?.currentWidget;
      if (!panel) {
        return false;
      }
      await panel.sessionContext.ready;
      const notebook = panel.content;
      NotebookActions.insertBelow(notebook);
      const cell = notebook.activeCell;
      if (!cell) {
        return false;
      }
      cell.model.sharedModel.setSource(`%finetune attach ${runId}`);
      shell.activateById(panel.id);
      await NotebookActions.run(notebook, panel.sessionContext);
      return true;
    };

    const sidebar = new RunsSidebar({ model, openDashboard });
    sidebar.title.icon = runsIcon;
    shell.add(sidebar, 'left', { rank: 600 });

    if (statusBar) {
      statusBar.registerStatusItem('nbtrain:status', {
        item: new RunsStatus(model),
        align: 'left',
        rank: 100
      });
    }
    model.start();
  }
};

const finetuneCellsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbtrain:finetune-cells',
  description: 'YAML highlighting and config-key completion in %%finetune cells.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICompletionProviderManager],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    completion: ICompletionProviderManager | null
  ) => {
    tracker.forEach(highlightFinetuneCells);
    tracker.widgetAdded.connect((_, panel) => highlightFinetuneCells(panel));
    completion?.registerProvider(new FinetuneCompletionProvider());
  }
};

export default [runsPlugin, finetuneCellsPlugin];
