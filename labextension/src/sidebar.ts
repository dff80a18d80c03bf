// The "Training runs" panel: one row per run with its state, progress, last loss and actions.
import { showErrorMessage } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IRunInfo, runAction } from './api';
import {
  formatBytes,
  progressFraction,
  sparklinePath,
  stepsText
} from './logic';
import { RunsModel } from './model';

const SPARK_W = 80;
const SPARK_H = 18;

export interface ISidebarOptions {
  model: RunsModel;
  // Inserts and runs `%finetune attach RUN` in the active notebook; null when no notebook is open.
  openDashboard: (runId: string) => Promise<boolean>;
}

export class RunsSidebar extends Widget {
  constructor(options: ISidebarOptions) {
    super();
    this._model = options.model;
    this._openDashboard = options.openDashboard;
    this.addClass('nbtrain-sidebar');
    this.id = 'nbtrain-runs';
    this.title.caption = 'Training runs';
    const header = document.createElement('div');
    header.className = 'nbtrain-header';
    header.textContent = 'Training runs';
    this._status = document.createElement('div');
    this._status.className = 'nbtrain-message';
    this._list = document.createElement('ul');
    this._list.className = 'nbtrain-runs';
    this._gpus = document.createElement('div');
    this._gpus.className = 'nbtrain-gpus';
    this.node.append(header, this._status, this._list, this._gpus);
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const model = this._model;
    this._status.textContent = model.error
      ? `Cannot reach the nbtrain server extension: ${model.error}`
      : model.runs.length === 0
        ? 'No runs yet. Start one with a %%finetune cell.'
        : '';
    // Rows are kept by run id and updated in place, so a poll never steals a button's focus or hover.
    const seen = new Set<string>();
    model.runs.forEach((run, i) => {
      seen.add(run.id);
      let row = this._rows.get(run.id);
      if (!row) {
        row = this._makeRow(run.id);
        this._rows.set(run.id, row);
      }
      if (this._list.children[i] !== row) {
        this._list.insertBefore(row, this._list.children[i] ?? null);
      }
      this._updateRow(row, run);
    });
    for (const [id, row] of this._rows) {
      if (!seen.has(id)) {
        row.remove();
        this._rows.delete(id);
      }
    }
    this._renderGpus();
  }

  /** Per-GPU memory in use (NVML, sampled once for all clients by the server); hidden without GPUs. */
  private _renderGpus(): void {
    const { gpus, error } = this._model.gpus;
    this._gpus.replaceChildren();
    this._gpus.title = error ?? '';
    if (gpus.length === 0) {
      this._gpus.style.display = 'none';
      return;
    }
    this._gpus.style.display = '';
    const head = document.createElement('div');
    head.className = 'nbtrain-header';
    head.textContent = 'GPU memory';
    this._gpus.append(head);
    for (const g of gpus) {
      const item = document.createElement('div');
      item.className = 'nbtrain-gpu';
      item.dataset.gpuIndex = String(g.index);
      const label = document.createElement('div');
      label.className = 'nbtrain-gpu-label';
      label.textContent = `GPU ${g.index} ${g.name}: ${formatBytes(g.memory_used)} / ${formatBytes(g.memory_total)}`;
      const bar = document.createElement('div');
      bar.className = 'nbtrain-progress';
      const fill = document.createElement('div');
      fill.className = 'nbtrain-progress-bar nbtrain-gpu-bar';
      fill.style.width = `${(progressFraction(g.memory_used, g.memory_total) * 100).toFixed(1)}%`;
      bar.append(fill);
      item.append(label, bar);
      this._gpus.append(item);
    }
  }

  private _makeRow(runId: string): HTMLLIElement {
    const row = document.createElement('li');
    row.className = 'nbtrain-run';
    row.dataset.runId = runId;
    row.innerHTML = `
      <div class="nbtrain-run-head">
        <span class="nbtrain-run-name"></span>
        <span class="nbtrain-state"></span>
      </div>
      <div class="nbtrain-progress"><div class="nbtrain-progress-bar"></div></div>
      <div class="nbtrain-run-detail">
        <span class="nbtrain-steps"></span>
        <svg class="nbtrain-spark" width="${SPARK_W}" height="${SPARK_H}" viewBox="0 0 ${SPARK_W} ${SPARK_H}"
          aria-label="loss"><path fill="none" stroke="currentColor" stroke-width="1.2"/></svg>
        <span class="nbtrain-loss"></span>
      </div>
      <div class="nbtrain-error"></div>
      <div class="nbtrain-actions">
        <button class="jp-mod-styled nbtrain-stop" data-action="stop">Stop</button>
        <button class="jp-mod-styled nbtrain-checkpoint" data-action="checkpoint">Checkpoint</button>
        <button class="jp-mod-styled nbtrain-open" data-action="open">Open dashboard</button>
      </div>`;
    row.querySelectorAll('button').forEach(button =>
      button.addEventListener('click', () =>
        void this._act(runId, button.dataset.action!, button)
      )
    );
    return row;
  }

  private _updateRow(row: HTMLLIElement, run: IRunInfo): void {
    const q = (sel: string) => row.querySelector(sel) as HTMLElement;
    q('.nbtrain-run-name').textContent = run.name;
    q('.nbtrain-run-name').title = `${run.id}\n${run.run_dir}`;
    const state = q('.nbtrain-state');
    state.textContent = run.state;
    state.className = `nbtrain-state nbtrain-state-${run.state}`;
    const frac = progressFraction(run.step, run.max_steps);
    q('.nbtrain-progress-bar').style.width = `${(frac * 100).toFixed(1)}%`;
    q('.nbtrain-steps').textContent = stepsText(run.step, run.max_steps);
    const spark = row.querySelector('.nbtrain-spark path');
    spark?.setAttribute('d', sparklinePath(run.losses ?? [], SPARK_W, SPARK_H));
    q('.nbtrain-loss').textContent =
      run.loss === null ? '' : `loss ${run.loss.toFixed(4)}`;
    const err = q('.nbtrain-error');
    err.textContent = run.error
      ? `${run.error.type ?? 'error'}: ${run.error.message ?? ''}`
      : '';
    err.style.display = run.error ? '' : 'none';
    const busy = this._busy.has(run.id);
    (q('.nbtrain-stop') as HTMLButtonElement).disabled = run.done || busy;
    (q('.nbtrain-checkpoint') as HTMLButtonElement).disabled =
      run.state !== 'running' || busy;
  }

  private async _act(
    runId: string,
    action: string,
    button: HTMLButtonElement
  ): Promise<void> {
    if (action === 'open') {
      if (!(await this._openDashboard(runId))) {
        void showErrorMessage(
          'No notebook',
          `Open a notebook to attach a dashboard to run ${runId}.`
        );
      }
      return;
    }
    const label = button.textContent;
    this._busy.add(runId);
    button.textContent = action === 'stop' ? 'Stopping…' : 'Requesting…';
    this._render();
    try {
      // Stop waits on the server until the run has saved its checkpoint and exited.
      await runAction(runId, action as 'stop' | 'checkpoint');
    } catch (e) {
      void showErrorMessage(
        `Could not ${action} run ${runId}`,
        e instanceof Error ? e.message : String(e)
      );
    } finally {
      this._busy.delete(runId);
      button.textContent = label;
      await this._model.refresh();
    }
  }

  private _model: RunsModel;
  private _openDashboard: (runId: string) => Promise<boolean>;
  private _status: HTMLDivElement;
  private _list: HTMLUListElement;
  private _gpus: HTMLDivElement;
  private _rows = new Map<string, HTMLLIElement>();
  private _busy = new Set<string>();
}
