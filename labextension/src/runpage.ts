// A run's page of its own in the main area, opened from its sidebar card: its state and progress, the loss
// (and eval loss), learning rate and throughput against the step, and the last lines of its log; Stop,
// Resume and Stop server as on the card. It reads the server extension's REST API only (no notebook, no
// kernel): any run, live, from wherever it was started, and after any kernel restart.
import { showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IRunInfo, RunAction, requestAPI, runAction } from './api';
import { axisLabel, chartGeometry, ISeries, progressFraction, stepsText } from './logic';

const POLL_MS = 2000; // while the run is active; an ended run is read every ENDED_POLL_MS (it may resume)
const ENDED_POLL_MS = 10000;
const CHART_W = 320;
const CHART_H = 120;
const LOG_LINES = 40;

// Each chart: its title and the metrics it draws (the first one's colour leads).
const CHARTS: { title: string; keys: string[]; fromZero: boolean }[] = [
  { title: 'loss', keys: ['loss', 'eval_loss'], fromZero: false },
  { title: 'learning rate', keys: ['lr', 'learning_rate'], fromZero: true },
  { title: 'throughput (tokens/s)', keys: ['tokens_per_s'], fromZero: true }
];

interface IMetrics {
  records: { [key: string]: unknown }[];
  offset: number;
  reset: boolean;
  caught_up: boolean;
}

export class RunPage extends Widget {
  constructor(runId: string, name: string) {
    super();
    this._runId = runId;
    this.id = `nbtrain-run-page-${runId}`;
    this.addClass('nbtrain-run-page');
    this.title.label = name;
    this.title.caption = `nbtrain run ${runId}`;
    this.title.closable = true;
    this.node.innerHTML = `
      <div class="nbtrain-page-head">
        <span class="nbtrain-page-name"></span>
        <span class="nbtrain-state"></span>
        <span class="nbtrain-page-steps"></span>
        <span class="nbtrain-page-loss"></span>
        <span class="nbtrain-actions-gap"></span>
        <button class="jp-mod-styled nbtrain-stop" data-action="stop">Stop</button>
        <button class="jp-mod-styled nbtrain-resume" data-action="resume">Resume</button>
        <button class="jp-mod-styled nbtrain-server-stop" data-action="server/stop">Stop server</button>
      </div>
      <div class="nbtrain-page-id"></div>
      <div class="nbtrain-progress"><div class="nbtrain-progress-bar"></div></div>
      <div class="nbtrain-error"></div>
      <div class="nbtrain-page-server"></div>
      <div class="nbtrain-page-charts"></div>
      <div class="nbtrain-page-log-head">last lines of the log</div>
      <pre class="nbtrain-page-log"></pre>
      <div class="nbtrain-page-updated"></div>`;
    this.node.querySelectorAll('button').forEach(b =>
      b.addEventListener('click', () => void this._act(b.dataset.action as RunAction))
    );
    const charts = this._q('.nbtrain-page-charts');
    for (const chart of CHARTS) {
      const box = document.createElement('div');
      box.className = 'nbtrain-page-chart';
      box.dataset.chart = chart.title;
      box.innerHTML = `<div class="nbtrain-page-chart-title"></div>
        <svg width="${CHART_W}" height="${CHART_H}" viewBox="0 0 ${CHART_W} ${CHART_H}"
          preserveAspectRatio="none"></svg>
        <div class="nbtrain-page-axis"><span class="nbtrain-page-ymin"></span>
          <span class="nbtrain-page-ymax"></span><span class="nbtrain-page-xmax"></span></div>`;
      box.querySelector('.nbtrain-page-chart-title')!.textContent = chart.title;
      charts.append(box);
    }
    void this._tick();
  }

  get runId(): string {
    return this._runId;
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    this._timer = 0;
    super.dispose();
  }

  private _q(sel: string): HTMLElement {
    return this.node.querySelector(sel) as HTMLElement;
  }

  private async _tick(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    let done = false;
    try {
      const run = await requestAPI<IRunInfo>(`runs/${encodeURIComponent(this._runId)}`);
      done = run.done && !run.server;
      await this._readMetrics();
      const logs = await requestAPI<{ text: string }>(
        `runs/${encodeURIComponent(this._runId)}/logs?n=${LOG_LINES}`
      );
      this._render(run, logs.text);
      this._lastRead = new Date().toLocaleTimeString();
      this._q('.nbtrain-page-updated').textContent = `read at ${this._lastRead}`;
    } catch (e) {
      // says so, and when it last could: the page keeps what it showed
      const why = e instanceof Error ? e.message : String(e);
      const since = this._lastRead ? `since ${this._lastRead}` : 'yet';
      this._q('.nbtrain-page-updated').textContent = `cannot reach the run ${since}: ${why}`;
    }
    if (!this.isDisposed) {
      this._timer = window.setTimeout(() => void this._tick(), done ? ENDED_POLL_MS : POLL_MS);
    }
  }

  /** The records appended since the last read, a few requests at once while behind. */
  private async _readMetrics(): Promise<void> {
    for (let i = 0; i < 20; i++) {
      const m = await requestAPI<IMetrics>(
        `runs/${encodeURIComponent(this._runId)}/metrics?offset=${this._offset}`
      );
      if (m.reset) {
        this._points = {};
      }
      for (const rec of m.records) {
        const step = rec.step;
        if (typeof step !== 'number') {
          continue;
        }
        for (const [key, value] of Object.entries(rec)) {
          if (typeof value === 'number' && key !== 'step' && key !== 't') {
            (this._points[key] ??= []).push([step, value]);
          }
        }
      }
      this._offset = m.offset;
      if (m.caught_up) {
        return;
      }
    }
  }

  private _render(run: IRunInfo, log: string): void {
    this.title.label = run.name;
    this._q('.nbtrain-page-name').textContent = run.name;
    const state = this._q('.nbtrain-state');
    state.textContent = run.state;
    state.className = `nbtrain-state nbtrain-state-${run.state}`;
    this._q('.nbtrain-page-steps').textContent = run.phase ?? stepsText(run.step, run.max_steps);
    this._q('.nbtrain-page-loss').textContent = run.loss === null ? '' : `loss ${run.loss.toFixed(4)}`;
    this._q('.nbtrain-page-id').textContent = `${run.id} · ${run.run_dir}`;
    const frac = run.state === 'completed' ? 1 : progressFraction(run.step, run.max_steps);
    this._q('.nbtrain-progress-bar').style.width = `${(frac * 100).toFixed(1)}%`;
    const err = this._q('.nbtrain-error');
    err.textContent = run.error ? `${run.error.type ?? 'error'}: ${run.error.message ?? ''}` : '';
    err.style.display = run.error ? '' : 'none';
    const server = this._q('.nbtrain-page-server');
    server.textContent = run.server
      ? `model server: ${run.server.url ?? run.server.note ?? 'another user\'s'}`
      : '';
    server.style.display = run.server ? '' : 'none';
    const show = (sel: string, on: boolean) => {
      const b = this._q(sel) as HTMLButtonElement;
      b.style.display = on ? '' : 'none';
      b.disabled = this._busy;
    };
    show('.nbtrain-stop', !run.done);
    show('.nbtrain-resume', run.resumable);
    show('.nbtrain-server-stop', !!run.server?.url);
    this.node.dataset.state = run.state;
    for (const chart of CHARTS) {
      this._renderChart(chart.title, chart.keys, chart.fromZero);
    }
    const pre = this._q('.nbtrain-page-log');
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = log;
    if (atEnd) {
      pre.scrollTop = pre.scrollHeight;
    }
  }

  private _renderChart(title: string, keys: string[], fromZero: boolean): void {
    const box = this.node.querySelector(`.nbtrain-page-chart[data-chart="${title}"]`) as HTMLElement;
    const series: ISeries[] = keys
      .filter(k => this._points[k]?.length)
      .map(k => ({ name: k, points: this._points[k] }));
    const g = chartGeometry(series, CHART_W, CHART_H, fromZero);
    const svg = box.querySelector('svg')!;
    svg.innerHTML = g.paths
      .map(
        (d, i) =>
          `<path class="nbtrain-page-line nbtrain-page-line-${i}" data-metric="${series[i].name}" d="${d}"/>`
      )
      .join('');
    const empty = series.length === 0;
    box.classList.toggle('nbtrain-page-chart-empty', empty);
    (box.querySelector('.nbtrain-page-ymin') as HTMLElement).textContent = empty ? '' : axisLabel(g.yMin);
    (box.querySelector('.nbtrain-page-ymax') as HTMLElement).textContent = empty ? '' : axisLabel(g.yMax);
    (box.querySelector('.nbtrain-page-xmax') as HTMLElement).textContent = empty
      ? 'no points yet'
      : `step ${g.xMax}`;
    const names = series.map(s => s.name).join(', ');
    (box.querySelector('.nbtrain-page-chart-title') as HTMLElement).textContent =
      series.length > 1 ? `${title} (${names})` : title;
  }

  private async _act(action: RunAction): Promise<void> {
    this._busy = true;
    try {
      await runAction(this._runId, action);
    } catch (e) {
      void showErrorMessage(`Could not ${action.replace('/', ' ')} run ${this.title.label}`,
        e instanceof Error ? e.message : String(e));
    } finally {
      this._busy = false; // the next read (within POLL_MS) shows what the action did
    }
  }

  private _runId: string;
  private _timer = 0;
  private _offset = 0;
  private _busy = false;
  private _lastRead = '';
  private _points: { [key: string]: [number, number][] } = {};
}
