// A notebook's nbtrain views once its kernel is lost (Kernel > Restart, a kernel that died, one shut down or
// changed). ipywidgets 8 keeps drawing every widget as it last was, greyed with a broken-link icon, as if
// current. At that moment this marks what nbtrain showed with that kernel:
// - a dashboard's live widget (its mark, nbtrain/ui/dashboard.py): its output gets LOST_CLASS, so the
//   dashboard's own style hides it and shows the snapshot beside it, the run view that follows the run
//   directory (runview.ts), saying where the live view was lost and offering to re-attach;
// - a config panel (nbtrain.panel()): one line saying how to get the form back, instead of the form's
//   dozens of broken links.
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';

export const LOST_CLASS = 'nbtrain-kernel-lost';
// what a panel whose form comes back when its cell runs again carries (nbtrain/ui/panel/widget.py)
const KEEPS_CLASS = 'nbtrain-panel-keeps';
const LINE_CLASS = 'nbtrain-panel-lost';

// the kernel statuses after which the kernel that drew the widgets is gone, and how to say it
const LOST_STATUS: { [status: string]: string } = {
  restarting: 'restarted',
  autorestarting: 'restarted',
  dead: 'died'
};

/** What a panel whose kernel is gone says: how to get the form back, and whether its values come too. */
export function panelLostText(keeps: boolean): string {
  return keeps
    ? 'run this cell to get the form back; your values are kept'
    : 'run this cell to get a new form; the values in this one are not kept';
}

/** Mark the views in ``panel`` whose kernel is gone (``why``: restarted, died, shut down, changed). */
export function markLost(panel: NotebookPanel, why: string): void {
  // every cell widget, attached or not (a windowed notebook keeps cells out of view off the page)
  for (const cell of panel.content.widgets) {
    for (const mark of cell.node.querySelectorAll('.nbtrain-live')) {
      mark.closest('.jp-OutputArea-child')?.classList.add(LOST_CLASS);
    }
    for (const form of cell.node.querySelectorAll<HTMLElement>('.nbtrain-panel')) {
      if (form.classList.contains(LOST_CLASS)) {
        continue;
      }
      form.classList.add(LOST_CLASS);
      const line = document.createElement('div');
      line.className = LINE_CLASS;
      const what = document.createElement('b');
      what.textContent = `kernel ${why}`;
      line.append(what, `: ${panelLostText(form.classList.contains(KEEPS_CLASS))}`);
      form.append(line);
    }
  }
}

/** Watch each notebook's kernel and mark its views once that kernel is gone. */
export function watchKernelLoss(tracker: INotebookTracker): void {
  const watch = (panel: NotebookPanel): void => {
    const ctx = panel.sessionContext;
    ctx.statusChanged.connect((_, status: Kernel.Status) => {
      const why = LOST_STATUS[status];
      if (why) {
        markLost(panel, why);
      }
    });
    // a kernel replaced or shut down (the first kernel a notebook connects to replaces none)
    ctx.kernelChanged.connect((_, change) => {
      if (change.oldValue) {
        markLost(panel, change.newValue ? 'changed' : 'shut down');
      }
    });
  };
  tracker.forEach(watch);
  tracker.widgetAdded.connect((_, panel) => watch(panel));
}
