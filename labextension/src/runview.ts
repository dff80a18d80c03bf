// A notebook's view of a run that needs no kernel: the renderer of nbtrain's run-view MIME type, which a
// dashboard puts beside the plotly JSON of its static pictures (a live run's snapshot, the last figure of a
// stopped or failed run). While the cell's kernel draws its live widget this output is hidden (the
// dashboard's own style); once that kernel is gone (restarted, shut down, the page reloaded without it:
// kernellost.ts marks the widget of a kernel lost while the page is open), this view follows the run from
// the run directory through the server extension, like the run's page, so it never shows an old state as if
// current: it says at which step the kernel's view was lost, where it reads from and when it last could, and
// Re-attach gives the run a live view again, in a new cell below (a `%finetune attach`, as the sidebar's
// Dashboard button does).
import { IRunInfo } from './api';
import { ENDED_POLL_MS, FollowedRun, headHTML, POLL_MS, RunFollower } from './follow';
import { count, progressFraction, stepsText } from './logic';
import { RunFigure } from './runfigure';

export const RUN_VIEW_MIME = 'application/vnd.nbtrain.run-view+json';
// Asks the sidebar's plugin (index.ts) to open a run's page: a MIME renderer has no shell of its own.
export const OPEN_PAGE_EVENT = 'nbtrain:open-page';
// Asks the same plugin to attach a live view of a run in a new cell below the one holding ``node``; it calls
// ``done`` with null, or why it could not (no kernel, the output is in no notebook).
export const ATTACH_EVENT = 'nbtrain:attach';

export interface IAttachRequest {
  runId: string;
  node: HTMLElement;
  done: (why: string | null) => void;
}

const HIDDEN_MS = 500;

interface IRunViewData {
  run_id: string;
  name?: string;
  // The kernel's picture of the run when it wrote this output, shown until the view has read the run.
  state?: string;
  step?: number;
  max_steps?: number | null;
  phase?: string | null;
  taken_at?: number;
  // The kernel's live widget this output stands in for: its mark has the class nbtrain-live-<view>, and its
  // figure the step its header showed (layout.meta), where the view stopped when its kernel was lost.
  view?: string;
  // Under the final figure of a stopped or failed run: the state and step it shows. The view stays empty
  // while the run is still so, and follows it (hiding the figure above) once it went on without the kernel.
  watch?: { state: string; step: number };
}

/** The shape of JupyterLab's IRenderMime.IMimeModel this renderer reads. */
interface IMimeModel {
  readonly data: { readonly [mime: string]: unknown };
}

export class RunView extends FollowedRun {
  constructor() {
    super();
    this.addClass('nbtrain-run-view');
    this.node.innerHTML = `${headHTML('<button class="jp-mod-styled nbtrain-view-page">Open page</button>')}
      <div class="nbtrain-progress"><div class="nbtrain-progress-bar"></div></div>
      <div class="nbtrain-error"></div>
      <div class="nbtrain-page-figure"></div>
      <div class="nbtrain-view-foot"><span class="nbtrain-page-updated"></span>
        <button class="nbtrain-view-attach" title="show this run live again, in a new cell below">Re-attach</button>
        <span class="nbtrain-view-attach-note"></span>
      </div>`;
    this.q('.nbtrain-view-page').addEventListener('click', () => {
      if (this._follower) {
        const detail = { runId: this._follower.runId, name: this._name };
        document.dispatchEvent(new CustomEvent(OPEN_PAGE_EVENT, { detail }));
      }
    });
    this.q('.nbtrain-view-attach').addEventListener('click', () => this._attach());
  }

  /** IRenderMime.IRenderer: show the run the output names (and keep following it). */
  async renderModel(model: IMimeModel): Promise<void> {
    const data = model.data[RUN_VIEW_MIME] as IRunViewData | undefined;
    if (!data?.run_id) {
      this.q('.nbtrain-page-updated').textContent = 'no run named in this output';
      return;
    }
    this._name = data.name ?? data.run_id;
    this._data = data;
    this.q('.nbtrain-page-name').textContent = this._name;
    this._watch = data.watch ?? null;
    this.node.classList.toggle('nbtrain-watching', this._watch !== null);
    this.node.classList.remove('nbtrain-went-on');
    if (this._follower?.runId !== data.run_id) {
      if (data.state) {
        this._first(data);
      }
      this._follower = new RunFollower(data.run_id);
      this._figure?.dispose();
      // the dashboard's own figure, as the run's page draws it (one chart mechanism: runfigure.ts)
      this._figure = new RunFigure(data.run_id, this.q('.nbtrain-page-figure'));
      window.clearTimeout(this.timer);
      await this._tick();
    }
  }

  private async _tick(): Promise<void> {
    const follower = this._follower;
    if (this.isDisposed || !follower) {
      return;
    }
    let done = false;
    // hidden (the kernel's live widget shows instead) or not on the page: nothing to read for now; a watch
    // is hidden until the run goes on, so it reads regardless
    const shown = this.node.isConnected && this.node.offsetParent !== null;
    if (shown || (this._watch !== null && this.node.isConnected)) {
      try {
        const run = await follower.read();
        done = run.done;
        const w = this._watch;
        this.node.classList.toggle('nbtrain-went-on', !!w && (run.state !== w.state || run.step !== w.step));
        this._render(run);
        this.q('.nbtrain-page-updated').textContent =
          `${this._lost()}: following the run directory · read at ${follower.lastRead}`;
        // the head first (state, step, time left), then the figure, which takes the server longer to build;
        // not for a watch still hidden under the final figure (nothing to draw it in)
        if (this.node.offsetParent !== null) {
          await this._figure?.update();
        }
      } catch (e) {
        this.q('.nbtrain-page-updated').textContent = follower.unreachable(e);
      }
    }
    if (!this.isDisposed && follower === this._follower) {
      // not shown yet (being laid out, or under the kernel's widget): look again soon, without reading
      const wait = !shown && this._watch === null ? HIDDEN_MS : done ? ENDED_POLL_MS : POLL_MS;
      this.timer = window.setTimeout(() => void this._tick(), wait);
    }
  }

  /** What the kernel saw when it wrote the output, said as such, until the first read of the run. */
  private _first(data: IRunViewData): void {
    const step = data.step ?? 0;
    const steps = data.phase ?? stepsText(step, data.max_steps ?? null);
    this.setState(data.state ?? '', steps, progressFraction(step, data.max_steps ?? null));
    const at = data.taken_at ? new Date(data.taken_at * 1000).toLocaleTimeString() : 'an earlier time';
    this.q('.nbtrain-page-updated').textContent = `as its kernel saw it at ${at}; reading the run…`;
  }

  /** Where the kernel's view stopped: the step its widget showed last, else the step of the output. */
  private _lost(): string {
    const d = this._data;
    const mark = d?.view ? document.querySelector(`.nbtrain-live-${CSS.escape(d.view)}`) : null;
    // plotly keeps the figure's layout on its element
    const plot = mark?.closest('.jp-OutputArea-child')?.querySelector('.js-plotly-plot') as
      | { layout?: { meta?: { nbtrain_step?: unknown } } }
      | null
      | undefined;
    const drawn = plot?.layout?.meta?.nbtrain_step;
    const step = this._watch?.step ?? (typeof drawn === 'number' ? drawn : d?.step);
    return step === undefined ? 'live view lost' : `live view lost at step ${count(step)}`;
  }

  /** Re-attach: a new cell below, showing the run live (index.ts runs it); says so, or why it could not. */
  private _attach(): void {
    const runId = this._follower?.runId;
    if (!runId) {
      return;
    }
    const button = this.q('.nbtrain-view-attach') as HTMLButtonElement;
    const note = this.q('.nbtrain-view-attach-note');
    button.disabled = true;
    note.textContent = 'attaching…';
    const done = (why: string | null): void => {
      button.disabled = false;
      note.textContent = why ? `could not re-attach: ${why}` : 'attached in the cell below';
      this.node.dataset.attach = why ? 'failed' : 'attached';
    };
    const detail: IAttachRequest = { runId, node: this.node, done };
    document.dispatchEvent(new CustomEvent(ATTACH_EVENT, { detail }));
  }

  private _render(run: IRunInfo): void {
    this._name = run.name;
    this.renderHead(run, this._follower!.points);
  }

  dispose(): void {
    this._figure?.dispose();
    this._figure = null;
    super.dispose();
  }

  private _follower: RunFollower | null = null;
  private _figure: RunFigure | null = null;
  private _watch: { state: string; step: number } | null = null;
  private _data: IRunViewData | null = null;
  private _name = '';
}
