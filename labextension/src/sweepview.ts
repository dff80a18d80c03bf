// A sweep's view in a notebook: the renderer of nbtrain's sweep-view MIME type, which the kernel puts beside
// the plotly JSON of the sweep's figure (ui/sweeps.py). It draws the same figure (every trial's curve, the
// parameters against the metric, the ranked trials), read by the server from the sweep's folder and its
// trials' run directories (sweeps/<id>/figure, through runfigure.ts), so it is current whether or not the
// kernel that started the sweep still runs; and it acts on the sweep as the CLI does: stop, resume, extend
// by a few trials, the best trial's config as a %%finetune cell below, and on one trial: stop it, or clone it
// with some keys changed (a new trial). SweepPage shows the same view as a page of the main area (the
// sidebar's "trial N of sweep NAME" opens it).
import { PanelLayout, Widget } from '@lumino/widgets';

import { requestAPI, runAction } from './api';
import { IFigureReply, RunFigure } from './runfigure';

export const SWEEP_VIEW_MIME = 'application/vnd.nbtrain.sweep-view+json';
// Asks the plugin (index.ts) to put a cell with ``source`` below the cell holding ``node``; it calls ``done``
// with null, or why it could not.
export const INSERT_CELL_EVENT = 'nbtrain:insert-cell';

export interface IInsertCellRequest {
  node: HTMLElement;
  source: string;
  done: (why: string | null) => void;
}

const POLL_MS = 2000;
const ENDED_POLL_MS = 10000;
const EXTEND_BY = 4;

interface ITrialChoice {
  number: number;
  state: string;
  run_id: string | null;
  label: string;
}

interface ISweepReply extends IFigureReply {
  state: string;
  done: boolean;
  text: string;
  trials: ITrialChoice[];
}

interface IMimeModel {
  readonly data: { readonly [mime: string]: unknown };
}

export class SweepView extends Widget {
  constructor() {
    super();
    this.addClass('nbtrain-sweep-view');
    this.node.innerHTML = `
      <div class="nbtrain-sweep-head">
        <span class="nbtrain-sweep-text"></span>
        <span class="nbtrain-actions-gap"></span>
        <button class="jp-mod-styled nbtrain-sweep-stop" title="stop every trial at a checkpoint; Resume goes on">Stop</button>
        <button class="jp-mod-styled nbtrain-sweep-resume" title="go on with the unfinished trials">Resume</button>
        <button class="jp-mod-styled nbtrain-sweep-extend" title="run ${EXTEND_BY} more trials">+${EXTEND_BY} trials</button>
        <button class="jp-mod-styled nbtrain-sweep-best" title="the best trial's config, as a %%finetune cell below">Best → cell</button>
      </div>
      <div class="nbtrain-sweep-trial">
        <label>trial <select class="nbtrain-sweep-pick"></select></label>
        <button class="jp-mod-styled nbtrain-sweep-trialstop" title="stop this trial at a checkpoint; the sweep goes on">Stop trial</button>
        <input class="nbtrain-sweep-set" spellcheck="false" placeholder="train.learning_rate=2e-4; lora.r=16"
          title="the keys the clone changes: KEY=VALUE, separated by ;" />
        <label class="nbtrain-sweep-warm" title="start the clone from this trial's weights (its last checkpoint) instead of the model"><input type="checkbox" class="nbtrain-sweep-fromckpt" /> from its checkpoint</label>
        <button class="jp-mod-styled nbtrain-sweep-clone" title="a new trial: this one's values with the keys beside changed">Clone</button>
      </div>
      <div class="nbtrain-sweep-figure"></div>
      <div class="nbtrain-view-foot"><span class="nbtrain-sweep-updated"></span>
        <span class="nbtrain-sweep-note"></span></div>`;
    this.button('stop').addEventListener('click', () => void this._act('stop', 'stopping the trials…'));
    this.button('resume').addEventListener('click', () => void this._act('resume', 'resuming…'));
    this.button('extend').addEventListener('click', () =>
      void this._act('extend', `adding ${EXTEND_BY} trials…`, { trials: EXTEND_BY })
    );
    this.button('best').addEventListener('click', () => void this._best());
    this.button('trialstop').addEventListener('click', () => void this._stopTrial());
    this.button('clone').addEventListener('click', () => {
      const trial = this._picked();
      if (trial) {
        const set = (this.q('.nbtrain-sweep-set') as HTMLInputElement).value;
        const fromCheckpoint = (this.q('.nbtrain-sweep-fromckpt') as HTMLInputElement).checked;
        void this._act('clone', `cloning trial ${trial.number}…`, {
          trial: trial.number,
          set,
          from_checkpoint: fromCheckpoint
        });
      }
    });
    this.q('.nbtrain-sweep-pick').addEventListener('change', () => this._syncTrialButtons());
  }

  /** The sweep this view follows, by id (the page's title names it once read). */
  get sweepId(): string | undefined {
    return this._figure?.runId;
  }

  /** IRenderMime.IRenderer: follow the sweep the output names (the same sweep again: nothing to do). */
  async renderModel(model: IMimeModel): Promise<void> {
    const data = model.data[SWEEP_VIEW_MIME] as { sweep_id?: string; name?: string } | undefined;
    if (!data?.sweep_id) {
      this.q('.nbtrain-sweep-text').textContent = 'no sweep named in this output';
      return;
    }
    if (this._figure?.runId === data.sweep_id) {
      return;
    }
    this.q('.nbtrain-sweep-text').textContent = `sweep ${data.name ?? data.sweep_id}: reading…`;
    this._figure?.dispose();
    this._figure = new RunFigure(data.sweep_id, this.q('.nbtrain-sweep-figure'), 'sweeps');
    window.clearTimeout(this._timer);
    await this._tick();
  }

  private async _tick(): Promise<void> {
    const figure = this._figure;
    if (this.isDisposed || !figure) {
      return;
    }
    let done = false;
    if (this.node.isConnected && this.node.offsetParent !== null) {
      try {
        const reply = await figure.update<ISweepReply>();
        if (reply) {
          done = reply.done;
          this._render(reply);
        }
        this.q('.nbtrain-sweep-updated').textContent =
          `following the sweep's folder · read at ${new Date().toLocaleTimeString()}`;
      } catch (e) {
        this.q('.nbtrain-sweep-updated').textContent = `the sweep could not be read: ${String(e)}`;
      }
    }
    if (!this.isDisposed && figure === this._figure) {
      this._timer = window.setTimeout(() => void this._tick(), done ? ENDED_POLL_MS : POLL_MS);
    }
  }

  private _render(reply: ISweepReply): void {
    this.q('.nbtrain-sweep-text').textContent = reply.text;
    this.node.dataset.state = reply.state;
    const running = reply.state === 'running';
    (this.button('stop') as HTMLButtonElement).disabled = !running;
    (this.button('resume') as HTMLButtonElement).disabled = running || reply.state === 'completed';
    this._trials = reply.trials ?? [];
    const pick = this.q('.nbtrain-sweep-pick') as HTMLSelectElement;
    const kept = pick.value;
    pick.replaceChildren(
      ...this._trials.map(t => {
        const o = document.createElement('option');
        o.value = String(t.number);
        o.textContent = t.label;
        return o;
      })
    );
    if (this._trials.some(t => String(t.number) === kept)) {
      pick.value = kept;
    }
    this._syncTrialButtons();
  }

  private _picked(): ITrialChoice | undefined {
    const value = (this.q('.nbtrain-sweep-pick') as HTMLSelectElement).value;
    return this._trials.find(t => String(t.number) === value);
  }

  private _syncTrialButtons(): void {
    const trial = this._picked();
    const live = !!trial?.run_id && ['running', 'queued'].includes(trial.state);
    (this.button('trialstop') as HTMLButtonElement).disabled = !live;
    (this.button('clone') as HTMLButtonElement).disabled = !trial;
  }

  private async _stopTrial(): Promise<void> {
    const trial = this._picked();
    if (!trial?.run_id) {
      return;
    }
    const note = this.q('.nbtrain-sweep-note');
    note.textContent = `stopping trial ${trial.number}…`;
    (this.button('trialstop') as HTMLButtonElement).disabled = true;
    try {
      await runAction(trial.run_id, 'stop');
      note.textContent = `trial ${trial.number} stopped; the sweep goes on`;
    } catch (e) {
      note.textContent = String(e);
    }
    window.clearTimeout(this._timer);
    await this._tick();
  }

  private async _act(action: string, doing: string, body: object = {}): Promise<void> {
    const id = this._figure?.runId;
    if (!id) {
      return;
    }
    const note = this.q('.nbtrain-sweep-note');
    note.textContent = doing;
    try {
      const reply = await requestAPI<{ text: string }>(`sweeps/${encodeURIComponent(id)}/${action}`, {
        method: 'POST',
        body: JSON.stringify(body)
      });
      note.textContent = reply.text;
    } catch (e) {
      note.textContent = String(e);
    }
    window.clearTimeout(this._timer);
    await this._tick();
  }

  private async _best(): Promise<void> {
    const id = this._figure?.runId;
    const note = this.q('.nbtrain-sweep-note');
    if (!id) {
      return;
    }
    try {
      const reply = await requestAPI<{ cell: string }>(`sweeps/${encodeURIComponent(id)}/best`);
      const done = (why: string | null): void => {
        note.textContent = why ? `could not insert the cell: ${why}` : 'the best config is in the cell below';
      };
      const detail: IInsertCellRequest = { node: this.node, source: reply.cell, done };
      document.dispatchEvent(new CustomEvent(INSERT_CELL_EVENT, { detail }));
    } catch (e) {
      note.textContent = String(e);
    }
  }

  private button(name: string): HTMLElement {
    return this.q(`.nbtrain-sweep-${name}`);
  }

  private q(selector: string): HTMLElement {
    return this.node.querySelector(selector) as HTMLElement;
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    this._figure?.dispose();
    this._figure = null;
    super.dispose();
  }

  private _figure: RunFigure | null = null;
  private _timer = 0;
  private _trials: ITrialChoice[] = [];
}

/** A sweep's view as a page of the main area, closable, one per sweep (index.ts keeps them). */
export class SweepPage extends Widget {
  constructor(sweepId: string, name: string) {
    super();
    this.id = `nbtrain-sweep-${sweepId}`;
    this.title.label = `sweep ${name}`;
    this.title.closable = true;
    this.addClass('nbtrain-sweep-page');
    this.view = new SweepView();
    const layout = new PanelLayout();
    this.layout = layout;
    layout.addWidget(this.view);
    void this.view.renderModel({ data: { [SWEEP_VIEW_MIME]: { sweep_id: sweepId, name } } });
  }

  readonly view: SweepView;
}
