// One poller for the whole page: the sidebar and the status bar read the same model, so an open lab
// costs two small requests every ~2 s however many views show runs.
import { ISignal, Signal } from '@lumino/signaling';

import { IGpus, IRunInfo, requestAPI } from './api';

export const POLL_MS = 2000;
// A hidden tab polls slowly: nobody sees it, and many open tabs would otherwise load the server.
const HIDDEN_POLL_MS = 20000;

export class RunsModel {
  runs: IRunInfo[] = [];
  gpus: IGpus = { gpus: [], error: null, sampled: null };
  error: string | null = null;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get activeRuns(): IRunInfo[] {
    return this.runs.filter(r => !r.done);
  }

  /** The runs whose model server runs (the server's process, whatever the run's state). */
  get servingRuns(): IRunInfo[] {
    return this.runs.filter(r => !!r.server);
  }

  start(): void {
    if (this._timer === null && !this._disposed) {
      void this._tick();
    }
  }

  async refresh(): Promise<void> {
    try {
      const [runs, gpus] = await Promise.all([
        requestAPI<IRunInfo[]>('runs'),
        requestAPI<IGpus>('gpus')
      ]);
      // Newest first: the run a user just started is the one they look for.
      this.runs = runs.slice().reverse();
      this.gpus = gpus;
      this.error = null;
    } catch (e) {
      this.error = e instanceof Error ? e.message : String(e);
    }
    this._changed.emit();
  }

  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private async _tick(): Promise<void> {
    // setTimeout after each reply, not setInterval: a slow server never gets overlapping polls.
    await this.refresh();
    if (!this._disposed) {
      const delay = document.hidden ? HIDDEN_POLL_MS : POLL_MS;
      this._timer = window.setTimeout(() => void this._tick(), delay);
    }
  }

  private _timer: number | null = null;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
