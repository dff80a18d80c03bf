// A notebook's run record line (nbtrain's run MIME type: the record saved with the notebook for grading,
// control/jobs/grading.py) as the record says it, and beside it what the run is now, read through the
// server extension: a record saved mid-run, or whose kernel is gone, does not pass for the run's state.
import { Widget } from '@lumino/widgets';

import { IRunInfo, requestAPI } from './api';
import { ENDED_POLL_MS, POLL_MS } from './follow';
import { stepsText } from './logic';

export const RECORD_MIME = 'application/vnd.nbtrain.run+json';
const RECORD_MARK =
  '<svg width="10" height="12" viewBox="0 0 10 12" aria-hidden="true" style="vertical-align:-1px">' +
  '<rect x="0.75" y="1.75" width="8.5" height="9.5" rx="1.5" fill="none" stroke="currentColor" ' +
  'stroke-width="1.2"/><rect x="3" y="0.5" width="4" height="2.5" rx="0.8" fill="currentColor"/></svg>';

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
    // a clipboard drawn inline (as the record's HTML fallback draws it, grading.RECORD_MARK): an emoji shows
    // as an empty box where no emoji font is installed (headless Chromium, many Linux desktops)
    this.node.innerHTML =
      `${RECORD_MARK} <span class="nbtrain-record-saved"></span> <span class="nbtrain-record-now"></span>`;
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
      `${line} (saved with this notebook)`;
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
