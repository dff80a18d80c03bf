// Following one run through the server extension's REST API alone (no notebook, no kernel): its status and
// its metrics, read incrementally from the run directory's metrics.jsonl (the server's one metrics reader),
// for the head line (state, step, time left, loss). The run's page (runpage.ts) and a notebook view whose
// kernel is gone (runview.ts) both show a run this way, with the dashboard's own figure (runfigure.ts).
import { Widget } from '@lumino/widgets';

import { IRunInfo, requestAPI } from './api';
import {
  chipState,
  progressFraction,
  progressLine,
  stepsText,
  waitingText
} from './logic';

export const POLL_MS = 2000; // while the run is active; an ended run is read every ENDED_POLL_MS (it may resume)
export const ENDED_POLL_MS = 10000;

interface IMetrics {
  records: { [key: string]: unknown }[];
  offset: number;
  reset: boolean;
  caught_up: boolean;
}

export type Points = { [key: string]: [number, number][] };

/** A run's status and metric points, kept up to date by ``read()``. */
export class RunFollower {
  constructor(readonly runId: string) {}

  /** The run's status, and the metric records appended since the last read (a few requests at once while
   * behind). Throws what the server answered when it cannot (the caller says so, and since when). */
  async read(): Promise<IRunInfo> {
    const run = await requestAPI<IRunInfo>(`runs/${encodeURIComponent(this.runId)}`);
    for (let i = 0; i < 20; i++) {
      const m = await requestAPI<IMetrics>(
        `runs/${encodeURIComponent(this.runId)}/metrics?offset=${this._offset}`
      );
      if (m.reset) {
        this.points = {};
      }
      for (const rec of m.records) {
        const step = rec.step;
        if (typeof step !== 'number') {
          continue;
        }
        for (const [key, value] of Object.entries(rec)) {
          if (typeof value === 'number' && key !== 'step' && key !== 't') {
            (this.points[key] ??= []).push([step, value]);
          }
        }
      }
      this._offset = m.offset;
      if (m.caught_up) {
        break;
      }
    }
    this.lastRead = new Date().toLocaleTimeString();
    return run;
  }

  /** What to say after a failed read: the error, and when the run was last read. */
  unreachable(e: unknown): string {
    const why = e instanceof Error ? e.message : String(e);
    return `cannot reach the run ${this.lastRead ? `since ${this.lastRead}` : 'yet'}: ${why}`;
  }

  points: Points = {};
  lastRead = '';
  private _offset = 0;
}

/** The step to show beside the charts: status.json is written every few seconds, the metrics every step,
 * so a live run's latest logged step may be ahead of its status. */
export function shownStep(run: IRunInfo, points: Points): number {
  const logged = Math.max(0, ...Object.values(points).map(p => (p.length ? p[p.length - 1][0] : 0)));
  return run.done ? run.step : Math.max(run.step, logged);
}

/** The head both show: name, state, steps, loss, then ``buttons`` at the right. */
export function headHTML(buttons: string): string {
  return `
      <div class="nbtrain-page-head">
        <span class="nbtrain-page-name"></span>
        <span class="nbtrain-state"></span>
        <span class="nbtrain-page-steps"></span>
        <span class="nbtrain-page-loss"></span>
        <span class="nbtrain-actions-gap"></span>
        ${buttons}
      </div>`;
}

/** What the run's page and a notebook's run view share: a poll timer freed with the widget, and the head
 * (name, state, steps or what the run is doing before its first logged step, loss, progress, error). */
export abstract class FollowedRun extends Widget {
  dispose(): void {
    window.clearTimeout(this.timer);
    this.timer = 0;
    super.dispose();
  }

  protected q(sel: string): HTMLElement {
    return this.node.querySelector(sel) as HTMLElement;
  }

  /** Draw the head from ``run`` and the points read so far; the step shown (see ``shownStep``). */
  protected renderHead(run: IRunInfo, points: Points): number {
    this.q('.nbtrain-page-name').textContent = run.name;
    const step = shownStep(run, points);
    const logged = Object.values(points).some(p => p.length > 0);
    const frac = run.state === 'completed' ? 1 : progressFraction(run.step, run.max_steps);
    // the steps and the server's time left; before the first loss when it comes (where the server knows)
    const firstLoss = logged ? null : run.first_loss_text;
    const steps =
      run.phase ??
      (logged || firstLoss
        ? progressLine(stepsText(step, run.max_steps), run.left_text, firstLoss)
        : progressLine(waitingText(run.state, null), run.left_text));
    this.setState(chipState(run.state, !!run.stopping), steps, frac);
    this.q('.nbtrain-page-loss').textContent = run.loss === null ? '' : `loss ${run.loss.toFixed(4)}`;
    const err = this.q('.nbtrain-error');
    err.textContent = run.error ? `${run.error.type ?? 'error'}: ${run.error.message ?? ''}` : '';
    err.style.display = run.error ? '' : 'none';
    this.node.dataset.step = String(step);
    return step;
  }

  /** The state chip, the steps text and the progress bar (``frac`` of the run done). */
  protected setState(state: string, steps: string, frac: number): void {
    const chip = this.q('.nbtrain-state');
    chip.textContent = state;
    chip.className = `nbtrain-state nbtrain-state-${state}`;
    this.q('.nbtrain-page-steps').textContent = steps;
    this.q('.nbtrain-progress-bar').style.width = `${(frac * 100).toFixed(1)}%`;
    this.node.dataset.state = state;
  }

  protected timer = 0;
}
