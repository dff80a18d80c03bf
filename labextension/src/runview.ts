// A notebook's view of a run that needs no kernel: the renderer of nbtrain's run-view MIME type, which a
// dashboard puts beside the plotly JSON of its static pictures (a live run's snapshot, the last figure of a
// stopped or failed run). While the cell's kernel draws its live widget this output is hidden (the
// dashboard's own style); once that kernel is gone (restarted, shut down, the page reloaded without it),
// this view follows the run from the run directory through the server extension, like the run's page, so
// it never shows an old state as if current: it says where it reads from and when it last could.
import { IRunInfo } from './api';
import { chartBoxes, ENDED_POLL_MS, FollowedRun, headHTML, POLL_MS, renderCharts, RunFollower } from './follow';
import { progressFraction, stepsText } from './logic';

export const RUN_VIEW_MIME = 'application/vnd.nbtrain.run-view+json';
// Asks the sidebar's plugin (index.ts) to open a run's page: a MIME renderer has no shell of its own.
export const OPEN_PAGE_EVENT = 'nbtrain:open-page';

const HIDDEN_MS = 500;
const CHART_W = 240;
const CHART_H = 90;

interface IRunViewData {
  run_id: string;
  name?: string;
  // The kernel's picture of the run when it wrote this output, shown until the view has read the run.
  state?: string;
  step?: number;
  max_steps?: number | null;
  phase?: string | null;
  taken_at?: number;
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
      <div class="nbtrain-page-charts"></div>
      <div class="nbtrain-page-updated"></div>`;
    this.q('.nbtrain-page-charts').append(...chartBoxes(CHART_W, CHART_H));
    this.q('.nbtrain-view-page').addEventListener('click', () => {
      if (this._follower) {
        const detail = { runId: this._follower.runId, name: this._name };
        document.dispatchEvent(new CustomEvent(OPEN_PAGE_EVENT, { detail }));
      }
    });
  }

  /** IRenderMime.IRenderer: show the run the output names (and keep following it). */
  async renderModel(model: IMimeModel): Promise<void> {
    const data = model.data[RUN_VIEW_MIME] as IRunViewData | undefined;
    if (!data?.run_id) {
      this.q('.nbtrain-page-updated').textContent = 'no run named in this output';
      return;
    }
    this._name = data.name ?? data.run_id;
    this.q('.nbtrain-page-name').textContent = this._name;
    this._watch = data.watch ?? null;
    this.node.classList.toggle('nbtrain-watching', this._watch !== null);
    this.node.classList.remove('nbtrain-went-on');
    if (this._follower?.runId !== data.run_id) {
      if (data.state) {
        this._first(data);
      }
      this._follower = new RunFollower(data.run_id);
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
          `followed from its run directory (no kernel follows this view) · read at ${follower.lastRead}`;
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

  private _render(run: IRunInfo): void {
    this._name = run.name;
    this.renderHead(run, this._follower!.points);
    renderCharts(this.node, this._follower!.points, CHART_W, CHART_H);
  }

  private _follower: RunFollower | null = null;
  private _watch: { state: string; step: number } | null = null;
  private _name = '';
}
