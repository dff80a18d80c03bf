// nbtrain's JupyterLab extension (also loaded by Jupyter Notebook 7): the "Training runs" sidebar, a run's
// page in the main area, a status-bar item, and %%finetune cells (YAML highlighting, config-key completion). All of it reads the
// server extension's REST API.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICompletionProviderManager } from '@jupyterlab/completer';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { TabPanel, Widget } from '@lumino/widgets';

import { FinetuneCompletionProvider, highlightFinetuneCells } from './finetune';
import { attachSource } from './logic';
import { RunsModel } from './model';
import { setRenderers } from './runfigure';
import { RunPage } from './runpage';
import { watchKernelLoss } from './kernellost';
import { ATTACH_EVENT, IAttachRequest, OPEN_PAGE_EVENT } from './runview';
import { IInsertCellRequest, INSERT_CELL_EVENT, SweepPage } from './sweepview';
import { RunsStatus } from './statusbar';
import { RunsSidebar } from './sidebar';
import { toCellPlugin } from './tocell';

// the query parameter that asks Notebook 7's file browser page to show a run's page
const PAGE_PARAM = 'nbtrain-run';

const runsIcon = new LabIcon({
  name: 'nbtrain:runs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<path class="jp-icon3" fill="#616161" d="M3 20h18v2H3zM5 10h3v8H5zm5.5-6h3v14h-3zM16 7h3v11h-3z"/>' +
    '</svg>'
});

/**
 * Whether the kernel has nbtrain's magics (`%load_ext nbtrain` ran since it started): asked silently
 * through a user expression, so nothing shows in the notebook. null when the kernel does not answer in
 * time (busy with a long cell) or is not IPython.
 */
async function magicsLoaded(kernel: Kernel.IKernelConnection): Promise<boolean | null> {
  const future = kernel.requestExecute({
    code: '',
    silent: true,
    store_history: false,
    user_expressions: { nbtrain: "'finetune' in get_ipython().magics_manager.magics['line']" }
  });
  let timer = 0;
  const late = new Promise<null>(resolve => {
    timer = window.setTimeout(() => resolve(null), 5000);
  });
  try {
    const reply = await Promise.race([future.done, late]);
    const content = reply?.content as KernelMessage.IExecuteReply | undefined;
    const answer = content?.user_expressions?.nbtrain as
      | { status?: string; data?: { 'text/plain'?: string } }
      | undefined;
    return answer?.status === 'ok' ? answer.data?.['text/plain'] === 'True' : null;
  } catch {
    return null;
  } finally {
    window.clearTimeout(timer);
  }
}

const runsPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbtrain:runs',
  description: 'Sidebar and status bar for nbtrain training runs (JupyterLab and Notebook 7).',
  autoStart: true,
  // Nothing required: in Notebook 7 there is no ILabShell nor status bar, and the sidebar goes in its
  // left panel (View > Left Sidebar > Show Training runs). The renderers draw the run page's charts with
  // plotly's own renderer (runfigure.ts).
  optional: [INotebookTracker, IStatusBar, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker | null,
    statusBar: IStatusBar | null,
    renderers: IRenderMimeRegistry | null
  ) => {
    const model = new RunsModel();
    setRenderers(renderers);

    // ``below``: an element in a notebook's cell (a run view's Re-attach): the new cell goes below that one
    const openDashboard = async (runId: string, below?: HTMLElement): Promise<string | null> => {
      const panel = below ? tracker?.find(p => p.node.contains(below)) : tracker?.currentWidget;
      if (!panel && below) {
        return 'this output is in no notebook open here';
      }
      if (!panel) {
        // no notebook to show it in (Notebook 7's file browser, a lab with none open): the run's page is
        // the same dashboard, needing none
        openPage(runId, model.runs.find(r => r.id === runId)?.name ?? runId);
        return null;
      }
      if (below) {
        const index = panel.content.widgets.findIndex(c => c.node.contains(below));
        panel.content.activeCellIndex = index >= 0 ? index : panel.content.activeCellIndex;
      }
      await panel.sessionContext.ready;
      const kernel = panel.sessionContext.session?.kernel;
      if (!kernel) {
        return `The notebook ${panel.title.label} has no kernel: select one (Kernel menu), then try again.`;
      }
      const source = attachSource(runId, await magicsLoaded(kernel));
      const notebook = panel.content;
      // An empty code cell in front (a new notebook's first cell) takes the attach cell; otherwise a new
      // cell below the active one does, so no empty cell is left behind.
      const active = notebook.activeCell;
      const empty =
        active?.model.type === 'code' && active.model.sharedModel.getSource().trim() === '';
      if (!empty) {
        NotebookActions.insertBelow(notebook);
      }
      const cell = notebook.activeCell;
      if (!cell) {
        return `The notebook ${panel.title.label} has no cell to show the dashboard in.`;
      }
      cell.model.sharedModel.setSource(source);
      app.shell.activateById(panel.id);
      await NotebookActions.run(notebook, panel.sessionContext);
      return null;
    };

    const pages = new Map<string, RunPage>();
    // Jupyter Notebook 7's main area holds one widget a page. On its file browser page that is a tab panel
    // (Files, Running): the run's page is a tab beside them. On its other pages (a notebook, an editor) the
    // run's page opens in a browser tab of its own: the file browser page, asked to show it (PAGE_PARAM).
    const notebook7 = app.name === 'Jupyter Notebook';
    const treeTabs = (): TabPanel | null => {
      const main = Array.from(app.shell.widgets('main'));
      return main.length === 1 && main[0] instanceof TabPanel ? main[0] : null;
    };
    // One page of the main area per id (a run's, a sweep's): made once, brought forward after; on Notebook
    // 7's file browser page, a tab beside Files and Running.
    const showPage = <W extends Widget>(pages: Map<string, W>, id: string, make: () => W): void => {
      const tabs = notebook7 ? treeTabs() : null;
      let page = pages.get(id);
      if (!page || page.isDisposed) {
        page = make();
        pages.set(id, page);
        page.disposed.connect(() => pages.delete(id));
        if (tabs) {
          tabs.addWidget(page);
        } else {
          app.shell.add(page, 'main');
        }
      }
      if (tabs) {
        tabs.currentWidget = page;
      } else {
        app.shell.activateById(page.id);
      }
    };
    const openPage = (runId: string, name: string): void => {
      if (notebook7 && !treeTabs()) {
        const url = URLExt.join(PageConfig.getBaseUrl(), 'tree');
        window.open(`${url}?${PAGE_PARAM}=${encodeURIComponent(runId)}`, '_blank');
        return;
      }
      showPage(pages, runId, () => new RunPage(runId, name));
    };
    const sweepPages = new Map<string, SweepPage>();
    const openSweep = (sweepId: string, name: string): void =>
      showPage(sweepPages, sweepId, () => new SweepPage(sweepId, name));
    if (notebook7) {
      const asked = new URLSearchParams(window.location.search).get(PAGE_PARAM);
      if (asked) {
        void app.restored.then(() => openPage(asked, asked));
      }
    }

    // a notebook's run view (runview.ts) asks for the run's page
    document.addEventListener(OPEN_PAGE_EVENT, e => {
      const { runId, name } = (e as CustomEvent<{ runId: string; name: string }>).detail;
      openPage(runId, name);
    });

    // a run view whose kernel was lost re-attaches: a live view in a new cell below its own
    document.addEventListener(INSERT_CELL_EVENT, e => {
      const { node, source, done } = (e as CustomEvent<IInsertCellRequest>).detail;
      // an output: below its cell; a page of the main area (a sweep's): below the active cell of the
      // notebook last used
      const panel = tracker?.find(p => p.node.contains(node)) ?? tracker?.currentWidget;
      if (!panel) {
        done('no notebook is open: open one, then try again');
        return;
      }
      const notebook = panel.content;
      const index = notebook.widgets.findIndex(c => c.node.contains(node));
      notebook.activeCellIndex = index >= 0 ? index : notebook.activeCellIndex;
      NotebookActions.insertBelow(notebook);
      notebook.activeCell?.model.sharedModel.setSource(source);
      done(null);
    });
    document.addEventListener(ATTACH_EVENT, e => {
      const { runId, node, done } = (e as CustomEvent<IAttachRequest>).detail;
      openDashboard(runId, node).then(done, err => done(String(err)));
    });
    if (tracker) {
      watchKernelLoss(tracker);
    }

    const sidebar = new RunsSidebar({ model, openDashboard, openPage, openSweep });
    sidebar.title.icon = runsIcon;
    app.shell.add(sidebar, 'left', { rank: 600 });

    if (statusBar) {
      statusBar.registerStatusItem('nbtrain:status', {
        item: new RunsStatus(model, () => app.shell.activateById(sidebar.id)),
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

export default [runsPlugin, finetuneCellsPlugin, toCellPlugin];
