// A run's page of its own in the main area, opened from its sidebar card (its Page, or its Dashboard where
// no notebook is open: Notebook 7's file browser): its state, progress and time left (the head, follow.ts),
// the charts a notebook's dashboard draws (runfigure.ts: the same plotly figure, with its scale and
// smoothing controls), and the last lines of its log, the trainer's metrics dicts written readably by the
// server; Stop, Resume and Stop server as on the card. It reads the server extension's REST API only (no
// notebook, no kernel): any run, live, from wherever it was started, and after any kernel restart.
import { showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IRunInfo, RunAction, requestAPI, runAction } from './api';
import { ENDED_POLL_MS, FollowedRun, headHTML, POLL_MS, RunFollower } from './follow';
import { STOP_TIP, STOPPING_TIP } from './logic';
import { RunFigure } from './runfigure';

const LOG_LINES = 40;

export class RunPage extends FollowedRun {
  constructor(runId: string, name: string) {
    super();
    this._follower = new RunFollower(runId);
    this.id = `nbtrain-run-page-${runId}`;
    this.addClass('nbtrain-run-page');
    this.title.label = name;
    this.title.caption = `nbtrain run ${runId}`;
    this.title.closable = true;
    this.node.innerHTML = `${headHTML(`
        <button class="jp-mod-styled nbtrain-stop" data-action="stop">Stop</button>
        <button class="jp-mod-styled nbtrain-resume" data-action="resume">Resume</button>
        <button class="jp-mod-styled nbtrain-server-stop" data-action="server/stop">Stop server</button>`)}
      <div class="nbtrain-progress"><div class="nbtrain-progress-bar"></div></div>
      <div class="nbtrain-page-id"></div>
      <div class="nbtrain-error"></div>
      <div class="nbtrain-page-server"></div>
      <div class="nbtrain-page-figure"></div>
      <div class="nbtrain-page-log-head">last lines of the log</div>
      <pre class="nbtrain-page-log"></pre>
      <div class="nbtrain-page-updated"></div>`;
    this.node.querySelectorAll('button').forEach(b =>
      b.addEventListener('click', () => void this._act(b.dataset.action as RunAction))
    );
    this._figure = new RunFigure(runId, this.q('.nbtrain-page-figure'));
    void this._tick();
  }

  dispose(): void {
    this._figure.dispose();
    super.dispose();
  }

  // also sent when its tab is shown again: a figure that came while it was hidden is drawn then
  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._figure.resize();
  }

  get runId(): string {
    return this._follower.runId;
  }

  private async _tick(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    let done = false;
    try {
      const run = await this._follower.read();
      done = run.done && !run.server;
      const logs = await requestAPI<{ text: string }>(
        `runs/${encodeURIComponent(this.runId)}/logs?n=${LOG_LINES}`
      );
      this._render(run, logs.text);
      await this._figure.update();
      this.q('.nbtrain-page-updated').textContent = `read at ${this._follower.lastRead}`;
    } catch (e) {
      // says so, and when it last could: the page keeps what it showed
      this.q('.nbtrain-page-updated').textContent = this._follower.unreachable(e);
    }
    if (!this.isDisposed) {
      this.timer = window.setTimeout(() => void this._tick(), done ? ENDED_POLL_MS : POLL_MS);
    }
  }

  private _render(run: IRunInfo, log: string): void {
    this.title.label = run.name;
    this.renderHead(run, this._follower.points);
    this.q('.nbtrain-page-id').textContent = `${run.id} · ${run.run_dir}`;
    const server = this.q('.nbtrain-page-server');
    server.textContent = run.server
      ? `model server: ${run.server.url ?? run.server.note ?? 'another user\'s'}`
      : '';
    server.style.display = run.server ? '' : 'none';
    const show = (sel: string, on: boolean) => {
      const b = this.q(sel) as HTMLButtonElement;
      b.style.display = on ? '' : 'none';
      b.disabled = this._busy;
    };
    show('.nbtrain-stop', !run.done);
    const stop = this.q('.nbtrain-stop') as HTMLButtonElement;
    stop.disabled ||= !!run.stopping;
    stop.textContent = run.stopping ? 'Stopping…' : 'Stop';
    stop.title = run.stopping ? STOPPING_TIP : STOP_TIP;
    show('.nbtrain-resume', run.resumable);
    show('.nbtrain-server-stop', !!run.server?.url);
    const pre = this.q('.nbtrain-page-log');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = log;
    if (atEnd) {
      pre.scrollTop = pre.scrollHeight;
    }
  }

  private async _act(action: RunAction): Promise<void> {
    this._busy = true;
    try {
      await runAction(this.runId, action);
    } catch (e) {
      void showErrorMessage(`Could not ${action.replace('/', ' ')} run ${this.title.label}`,
        e instanceof Error ? e.message : String(e));
    } finally {
      this._busy = false; // the next read (within POLL_MS) shows what the action did
    }
  }

  private _follower: RunFollower;
  private _figure: RunFigure;
  private _busy = false;
}
