// A notebook's run record line (nbtrain's run MIME type: the record saved with the notebook for grading,
// control/jobs/grading.py) as the record says it, and beside it what the run is now, read through the
// server extension: a record saved mid-run, or whose kernel is gone, does not pass for the run's state.
import { Widget } from '@lumino/widgets';

import { IRunInfo, requestAPI } from './api';
import { ENDED_POLL_MS, POLL_MS } from './follow';
import { stepsText } from './logic';

export const RECORD_MIME = 'application/vnd.nbtrain.run+json';

interface IRecord {
  id: string;
  state?: string;
  step?: number;
}

interface IMimeModel {
  readonly data: { readonly [mime: string]: unknown };
}

export class RecordLine extends Widget {
  constructor() {
    super();
    this.addClass('nbtrain-record');
    this.node.innerHTML = '<span class="nbtrain-record-saved"></span> <span class="nbtrain-record-now"></span>';
  }

  async renderModel(model: IMimeModel): Promise<void> {
    const rec = model.data[RECORD_MIME] as IRecord | undefined;
    if (!rec?.id) {
      return;
    }
    this._rec = rec;
    // the kernel's own line for the record (its text/plain), as the HTML beside it shows it
    const plain = model.data['text/plain'];
    const line = typeof plain === 'string' ? plain : `nbtrain run record ${rec.id}`;
    (this.node.querySelector('.nbtrain-record-saved') as HTMLElement).textContent =
      `\u{1F4CB} ${line} (saved with this notebook)`;
    window.clearTimeout(this._timer);
    await this._tick();
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    super.dispose();
  }

  private async _tick(): Promise<void> {
    const rec = this._rec;
    if (this.isDisposed || !rec) {
      return;
    }
    const now = this.node.querySelector('.nbtrain-record-now') as HTMLElement;
    let done = true;
    if (this.node.isConnected) {
      try {
        const run = await requestAPI<IRunInfo>(`runs/${encodeURIComponent(rec.id)}`);
        done = run.done;
        const same = run.state === rec.state && run.step === rec.step;
        now.textContent = same ? '' : `· now ${run.state}, ${stepsText(run.step, run.max_steps)}`;
        this.node.dataset.state = run.state;
      } catch {
        now.textContent = ''; // a record may outlive its run directory: the record is what it says
      }
    }
    if (!this.isDisposed && rec === this._rec) {
      this._timer = window.setTimeout(() => void this._tick(), done ? ENDED_POLL_MS : POLL_MS);
    }
  }

  private _rec: IRecord | null = null;
  private _timer = 0;
}
