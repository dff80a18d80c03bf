// The config panel's "To cell" (nbtrain/ui/panel.py): the kernel opens a comm on the target below and the
// notebook inserts the %%finetune cell at once, below the cell that shows the panel. Without this (another
// frontend, or the extension not installed) the panel falls back to IPython's set_next_input, which a
// notebook only applies when the next cell runs.
//
// The protocol, comm data both ways:
//   kernel {action: 'hello', panel}          -> frontend {ready: true}       (the panel knows we are here)
//   kernel {action: 'insert', panel, source} -> frontend {inserted: index} | {error: message}, then close
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';

export const CELLS_TARGET = 'nbtrain.cells';

interface IRequest {
  action?: string;
  panel?: string;
  source?: string;
}

/** The index of the cell whose output shows the panel (a class on its root widget), or -1. */
function panelCell(panel: NotebookPanel, panelClass: string): number {
  const selector = `.${CSS.escape(panelClass)}`;
  return panel.content.widgets.findIndex(cell => cell.node.querySelector(selector) !== null);
}

/** Insert a code cell holding `source` below the panel's cell (else the active cell); its index. */
export function insertBelowPanel(panel: NotebookPanel, panelClass: string, source: string): number {
  const notebook = panel.content;
  const model = notebook.model;
  if (!model) {
    throw new Error('the notebook is not loaded');
  }
  let index = panelCell(panel, panelClass);
  if (index < 0) {
    index = notebook.activeCellIndex;
  }
  model.sharedModel.insertCell(index + 1, { cell_type: 'code', source });
  notebook.activeCellIndex = index + 1;
  const cell = notebook.activeCell;
  if (cell) {
    void notebook.scrollToCell(cell);
  }
  return index + 1;
}

/** Which notebook answers an insert: several may share one kernel. The one showing the panel; without a
 * panel on the page (a reloaded tab), the notebook in front, else the first on this kernel. */
function owner(tracker: INotebookTracker, kernelId: string, panelClass: string): NotebookPanel | null {
  const mine: NotebookPanel[] = [];
  tracker.forEach(p => {
    if (p.sessionContext.session?.kernel?.id === kernelId) {
      mine.push(p);
    }
  });
  const current = tracker.currentWidget;
  return (
    mine.find(p => panelCell(p, panelClass) >= 0) ??
    (current && mine.includes(current) ? current : mine[0]) ??
    null
  );
}

function onOpen(
  tracker: INotebookTracker,
  panel: NotebookPanel,
  kernelId: string,
  comm: Kernel.IComm,
  msg: KernelMessage.ICommOpenMsg
): void {
  const request = msg.content.data as IRequest;
  if (request.action === 'hello') {
    comm.send({ ready: true });
    return;
  }
  const panelClass = request.panel ?? '';
  if (owner(tracker, kernelId, panelClass) !== panel) {
    return; // another notebook on this kernel answers
  }
  if (request.action !== 'insert' || typeof request.source !== 'string') {
    comm.send({ error: `unknown request ${JSON.stringify(request.action)}` });
  } else {
    try {
      comm.send({ inserted: insertBelowPanel(panel, panelClass, request.source) });
    } catch (error) {
      comm.send({ error: String(error) });
    }
  }
  comm.close();
}

function watch(tracker: INotebookTracker, panel: NotebookPanel): void {
  const register = (kernel: Kernel.IKernelConnection | null | undefined) => {
    kernel?.registerCommTarget(CELLS_TARGET, (comm, msg) =>
      onOpen(tracker, panel, kernel.id, comm, msg)
    );
  };
  panel.sessionContext.kernelChanged.connect((_, change) => register(change.newValue));
  register(panel.sessionContext.session?.kernel);
}

export const toCellPlugin: JupyterFrontEndPlugin<void> = {
  id: 'nbtrain:to-cell',
  description: "Inserts the config panel's %%finetune cell into the notebook at once.",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker) => {
    tracker.forEach(panel => watch(tracker, panel));
    tracker.widgetAdded.connect((_, panel) => watch(tracker, panel));
  }
};
