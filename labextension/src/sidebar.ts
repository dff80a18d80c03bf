// The "Training runs" panel: a filter box, then the active runs (and ended ones whose model server runs),
// the ones Resume can continue, and the other finished ones (a group that folds away), one card per run with
// its name, state, id, start time and folder, progress, last loss, its model server's address, and the
// actions its state allows (the others are hidden, not disabled): Stop while it is active, Checkpoint while
// it trains; Resume where a stopped or failed run has a checkpoint to continue from, Stop server while its
// server runs, and Delete, once ended and not serving.
import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { caretDownIcon, deleteIcon, LabIcon, launchIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IRunInfo, RunAction, runAction } from './api';
import {
  chipState,
  FOLD_FINISHED_OVER,
  formatBytes,
  groupRuns,
  withSweepsTogether,
  matchesFilter,
  progressFraction,
  sparklinePath,
  startedText,
  STOP_TIP,
  STOPPING_TIP,
  progressLine,
  stepsText
} from './logic';
import { RunsModel } from './model';

const SPARK_W = 80;
const SPARK_H = 18;

// A line chart: the dashboard (loss, learning rate, memory over the steps).
const dashboardIcon = new LabIcon({
  name: 'nbtrain:dashboard',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<path style="fill: none" stroke="currentColor" stroke-width="2" stroke-linecap="round" ' +
    'stroke-linejoin="round" d="M4 4v16h16M7.5 14.5l3.5-4.5 3.5 3 5-6.5"/></svg>'
});

export interface ISidebarOptions {
  model: RunsModel;
  // Shows a dashboard of the run in the active notebook (a cell that attaches to it); resolves to null,
  // or to why it could not (no notebook open, no kernel).
  openDashboard: (runId: string) => Promise<string | null>;
  // Opens (or brings forward) the run's page in the main area: no notebook or kernel needed.
  openPage: (runId: string, name: string) => void;
  // Opens (or brings forward) a sweep's page: its view (sweepview.ts) in the main area.
  openSweep: (sweepId: string, name: string) => void;
}

interface IGroup {
  node: HTMLElement;
  head: HTMLElement;
  count: HTMLElement;
  list: HTMLUListElement;
}

const VERB: { [a in RunAction]: string } = {
  stop: 'stop',
  checkpoint: 'checkpoint',
  resume: 'resume',
  delete: 'delete',
  'server/stop': 'stop the model server of'
};

export class RunsSidebar extends Widget {
  constructor(options: ISidebarOptions) {
    super();
    this._model = options.model;
    this._openDashboard = options.openDashboard;
    this._openPage = options.openPage;
    this._openSweep = options.openSweep;
    this.addClass('nbtrain-sidebar');
    this.id = 'nbtrain-runs';
    this.title.caption = 'Training runs';
    const header = document.createElement('div');
    header.className = 'nbtrain-header';
    header.textContent = 'Training runs';
    this._filter = document.createElement('input');
    this._filter.type = 'search';
    this._filter.className = 'nbtrain-filter';
    this._filter.placeholder = 'Filter by name, model, id or state';
    this._filter.setAttribute('aria-label', 'Filter runs');
    this._filter.addEventListener('input', () => this._render());
    this._status = document.createElement('div');
    this._status.className = 'nbtrain-message';
    this._active = this._makeGroup('active', 'Active', false);
    this._resumable = this._makeGroup('resumable', 'Can resume', false);
    this._finished = this._makeGroup('finished', 'Finished', true);
    this._gpus = document.createElement('div');
    this._gpus.className = 'nbtrain-gpus';
    this.node.append(
      header,
      this._filter,
      this._status,
      this._active.node,
      this._resumable.node,
      this._finished.node,
      this._gpus
    );
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _makeGroup(kind: string, label: string, foldable: boolean): IGroup {
    const node = document.createElement('section');
    node.className = `nbtrain-group nbtrain-group-${kind}`;
    const head = document.createElement(foldable ? 'button' : 'div');
    head.className = 'nbtrain-group-head';
    if (foldable) {
      head.classList.add('nbtrain-group-toggle');
      head.title = 'Show or hide the finished runs';
      head.append(caretDownIcon.element({ tag: 'span', className: 'nbtrain-caret' }));
      head.addEventListener('click', () => {
        this._folded = !this._isFolded();
        this._render();
      });
    }
    const text = document.createElement('span');
    text.textContent = label;
    const count = document.createElement('span');
    count.className = 'nbtrain-group-count';
    head.append(text, count);
    const list = document.createElement('ul');
    list.className = 'nbtrain-runs';
    node.append(head, list);
    return { node, head, count, list };
  }

  /** Finished runs start folded when there are many; a click on the group's head decides from then on. */
  private _isFolded(): boolean {
    const finished = groupRuns(this._model.runs).finished.length;
    return this._folded ?? finished > FOLD_FINISHED_OVER;
  }

  private _render(): void {
    const model = this._model;
    const query = this._filter.value.trim();
    const shown = withSweepsTogether(model.runs.filter(r => matchesFilter(r, query)));
    const { active, resumable, finished } = groupRuns(shown);
    this._status.textContent = model.error
      ? `Cannot reach the nbtrain server extension: ${model.error}`
      : model.runs.length === 0
        ? 'No runs yet. Start one with a %%finetune cell.'
        : shown.length === 0
          ? `No run matches “${query}”.`
          : '';
    this._filter.style.display = model.runs.length === 0 ? 'none' : '';
    // While filtering, finished runs that match are shown even when the group is folded.
    const folded = !query && this._isFolded();
    this._fill(this._active, active, false);
    this._fill(this._resumable, resumable, false);
    this._fill(this._finished, finished, folded);
    this._finished.head.setAttribute('aria-expanded', String(!folded));
    this._finished.node.classList.toggle('nbtrain-folded', folded);
    // Rows of runs no longer listed (deleted, or filtered out) go.
    const seen = new Set(shown.map(r => r.id));
    for (const [id, row] of this._rows) {
      if (!seen.has(id)) {
        row.remove();
        this._rows.delete(id);
      }
    }
    this._renderGpus();
  }

  private _fill(group: IGroup, runs: IRunInfo[], folded: boolean): void {
    group.node.style.display = runs.length === 0 ? 'none' : '';
    group.count.textContent = String(runs.length);
    group.list.style.display = folded ? 'none' : '';
    // Rows are kept by run id and updated in place, so a poll never steals a button's focus or hover.
    runs.forEach((run, i) => {
      let row = this._rows.get(run.id);
      if (!row) {
        row = this._makeRow(run.id);
        this._rows.set(run.id, row);
      }
      if (group.list.children[i] !== row) {
        group.list.insertBefore(row, group.list.children[i] ?? null);
      }
      this._updateRow(row, run);
    });
  }

  /** Per-GPU memory in use (NVML, sampled once for all clients by the server); hidden without GPUs. */
  private _renderGpus(): void {
    const { gpus } = this._model.gpus;
    this._gpus.replaceChildren();
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
      <div class="nbtrain-run-id"></div>
      <div class="nbtrain-run-meta">
        <span class="nbtrain-run-time"></span>
        <span class="nbtrain-run-folder"></span>
      </div>
      <div class="nbtrain-run-sweep"></div>
      <div class="nbtrain-progress"><div class="nbtrain-progress-bar"></div></div>
      <div class="nbtrain-run-detail">
        <span class="nbtrain-steps"></span>
        <svg class="nbtrain-spark" width="${SPARK_W}" height="${SPARK_H}" viewBox="0 0 ${SPARK_W} ${SPARK_H}" preserveAspectRatio="none"
          aria-label="loss"><path fill="none" stroke="currentColor" stroke-width="1.2"/></svg>
        <span class="nbtrain-loss"></span>
      </div>
      <div class="nbtrain-error"></div>
      <div class="nbtrain-run-note"></div>
      <div class="nbtrain-server">
        <span class="nbtrain-server-chip">serving</span>
        <span class="nbtrain-server-url"></span>
        <button class="jp-mod-styled nbtrain-server-stop" data-action="server/stop"
          title="Stop this run's model server (its process group; the run itself is not touched)">Stop server</button>
      </div>
      <div class="nbtrain-actions">
        <button class="jp-mod-styled nbtrain-stop" data-action="stop">Stop</button>
        <button class="jp-mod-styled nbtrain-checkpoint" data-action="checkpoint"
          title="Save a checkpoint after the current step and keep training">Checkpoint</button>
        <button class="jp-mod-styled nbtrain-resume" data-action="resume">Resume</button>
        <span class="nbtrain-actions-gap"></span>
        <button class="jp-mod-styled nbtrain-page" data-action="page" aria-label="Page"
          title="Open this run's page: its charts and log, live, no notebook needed"><span
          class="nbtrain-open-label">Page</span></button>
        <button class="jp-mod-styled nbtrain-open" data-action="open" aria-label="Dashboard"
          title="Show this run's dashboard in the active notebook (with none open, on its page)"><span
          class="nbtrain-open-label">Dashboard</span></button>
        <button class="jp-mod-styled nbtrain-delete" data-action="delete" aria-label="Delete run"
          title="Delete run (moves its folder to the trash)"></button>
      </div>`;
    row
      .querySelector('.nbtrain-open')!
      .prepend(dashboardIcon.element({ tag: 'span', className: 'nbtrain-icon' }));
    row
      .querySelector('.nbtrain-page')!
      .prepend(launchIcon.element({ tag: 'span', className: 'nbtrain-icon' }));
    row
      .querySelector('.nbtrain-delete')!
      .append(deleteIcon.element({ tag: 'span', className: 'nbtrain-icon' }));
    row.querySelectorAll('button').forEach(button =>
      button.addEventListener('click', () => void this._act(runId, button.dataset.action!))
    );
    row.querySelector('.nbtrain-run-sweep')!.addEventListener('click', () => {
      const sweep = this._model.runs.find(r => r.id === runId)?.sweep;
      if (sweep) {
        this._openSweep(sweep.id, sweep.name);
      }
    });
    return row;
  }

  private _updateRow(row: HTMLLIElement, run: IRunInfo): void {
    const q = (sel: string) => row.querySelector(sel) as HTMLElement;
    const b = (sel: string) => row.querySelector(sel) as HTMLButtonElement;
    q('.nbtrain-run-name').textContent = run.name;
    q('.nbtrain-run-name').title = run.name;
    // From the click on Stop (here or anywhere else) until the run has stopped, the chip says "stopping",
    // the steps line what it waits for ("stopping after step 4, ~3 s") and Stop "Stopping…".
    const busy = this._busy.get(run.id);
    const stopping = busy === 'stop' || !!run.stopping;
    const chip = chipState(run.state, stopping);
    const state = q('.nbtrain-state');
    state.textContent = chip;
    state.className = `nbtrain-state nbtrain-state-${chip}`;
    q('.nbtrain-run-id').textContent = run.id;
    q('.nbtrain-run-id').title = `${run.id}\n${run.run_dir}`;
    const started = startedText(run.created);
    q('.nbtrain-run-time').textContent = started ? `started ${started}` : '';
    q('.nbtrain-run-folder').textContent = `in ${run.folder ?? run.run_dir}`;
    const sweep = q('.nbtrain-run-sweep');
    sweep.textContent = run.sweep ? `trial ${run.sweep.trial} of sweep ${run.sweep.name}` : '';
    sweep.style.display = run.sweep ? '' : 'none';
    sweep.title = run.sweep ? `open sweep ${run.sweep.name}: every trial, and what to do with them` : '';
    q('.nbtrain-run-folder').title = run.run_dir;
    const frac = run.state === 'completed' ? 1 : progressFraction(run.step, run.max_steps);
    q('.nbtrain-progress-bar').style.width = `${(frac * 100).toFixed(1)}%`;
    row.dataset.state = run.state;
    row.dataset.done = String(run.done);
    row.dataset.stopping = String(stopping);
    row.dataset.resumable = String(run.resumable);
    // The steps, the time left and before the first loss when it comes, or what a starting run does.
    const firstLoss = run.loss === null ? run.first_loss_text : null;
    q('.nbtrain-steps').textContent =
      run.phase ?? progressLine(stepsText(run.step, run.max_steps), run.left_text, firstLoss);
    // Before the first loss that line takes the whole width (no sparkline or loss yet).
    q('.nbtrain-run-detail').classList.toggle('nbtrain-has-phase', !!run.phase || !!firstLoss);
    const spark = row.querySelector('.nbtrain-spark path');
    spark?.setAttribute('d', sparklinePath(run.losses ?? [], SPARK_W, SPARK_H));
    q('.nbtrain-loss').textContent = run.loss === null ? '' : `loss ${run.loss.toFixed(4)}`;
    const err = q('.nbtrain-error');
    err.textContent = run.error ? `${run.error.type ?? 'error'}: ${run.error.message ?? ''}` : '';
    err.title = err.textContent;
    err.style.display = run.error ? '' : 'none';

    // Each button's words follow the run's state and this sidebar's request, never a label kept from
    // before: a run that has stopped shows no "Stopping…", and a finished run no Stop at all.
    const show = (button: HTMLButtonElement, on: boolean) => {
      button.style.display = on ? '' : 'none';
    };
    const stop = b('.nbtrain-stop');
    show(stop, !run.done);
    stop.disabled = !!busy || stopping;
    stop.textContent = stopping ? 'Stopping…' : 'Stop';
    stop.title = stopping ? STOPPING_TIP : STOP_TIP;
    // A stop saves a checkpoint itself: no Checkpoint button beside it meanwhile (the row keeps one line).
    const checkpoint = b('.nbtrain-checkpoint');
    show(checkpoint, run.state === 'running' && !stopping);
    checkpoint.disabled = !!busy;
    checkpoint.textContent = busy === 'checkpoint' ? 'Requesting…' : 'Checkpoint';
    // Resume only where it can continue (stopped or failed, with a complete checkpoint); elsewhere a
    // stopped or failed card says why not in a line of its own, and no disabled button sits there.
    const resume = b('.nbtrain-resume');
    show(resume, run.resumable);
    resume.disabled = !!busy;
    resume.textContent = busy === 'resume' ? 'Resuming…' : 'Resume';
    resume.title = 'Continue training from its last complete checkpoint';
    const note = q('.nbtrain-run-note');
    const why = (run.state === 'stopped' || run.state === 'failed') && !run.resumable;
    note.textContent = why ? `Cannot resume: ${run.resume_note ?? 'no checkpoint'}` : '';
    note.title = note.textContent;
    note.style.display = why ? '' : 'none';
    const del = b('.nbtrain-delete');
    show(del, run.done && !run.server); // a run whose server runs is not deleted under it
    del.disabled = !!busy;
    // Its model server, while one runs: where it answers, and a Stop of its own.
    const server = q('.nbtrain-server');
    server.style.display = run.server ? '' : 'none';
    const where = run.server ? run.server.url ?? run.server.note ?? "another user's server" : '';
    q('.nbtrain-server-url').textContent = where;
    q('.nbtrain-server-url').title = run.server?.url
      ? `OpenAI-compatible server of this run: ${run.server.url} (engine ${run.server.engine ?? 'builtin'}, ` +
        `${run.server.device ?? 'cpu'}); its key is in the run's serve.json`
      : where;
    const stopServer = b('.nbtrain-server-stop');
    show(stopServer, !!run.server?.url);
    stopServer.disabled = !!busy;
    stopServer.textContent = busy === 'server/stop' ? 'Stopping…' : 'Stop server';
  }

  private async _act(runId: string, action: string): Promise<void> {
    const run = this._model.runs.find(r => r.id === runId);
    if (action === 'page') {
      this._openPage(runId, run?.name ?? runId);
      return;
    }
    if (action === 'open') {
      const why = await this._openDashboard(runId);
      if (why !== null) {
        void showErrorMessage('Cannot show the dashboard', why);
      }
      return;
    }
    if (action === 'delete' && !(await this._confirmDelete(runId, run))) {
      return;
    }
    this._busy.set(runId, action as RunAction);
    this._render();
    try {
      // Stop waits on the server until the run has saved its checkpoint and exited.
      await runAction(runId, action as RunAction);
    } catch (e) {
      void showErrorMessage(
        `Could not ${VERB[action as RunAction] ?? action} run ${run?.name ?? runId}`,
        e instanceof Error ? e.message : String(e)
      );
    } finally {
      this._busy.delete(runId);
      await this._model.refresh();
    }
  }

  private async _confirmDelete(runId: string, run: IRunInfo | undefined): Promise<boolean> {
    const body = document.createElement('div');
    body.className = 'nbtrain-delete-body';
    const folder = run?.folder ?? 'its runs folder';
    body.append(
      `Run ${runId} leaves the list and its folder moves to ${folder}/.trash/ ` +
        '(checkpoints and output included). Nothing is erased: delete that folder to free the space.'
    );
    const result = await showDialog({
      title: `Delete run “${run?.name ?? runId}”?`,
      body: new Widget({ node: body }),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    return result.button.accept;
  }

  private _model: RunsModel;
  private _openDashboard: (runId: string) => Promise<string | null>;
  private _openPage: (runId: string, name: string) => void;
  private _openSweep: (sweepId: string, name: string) => void;
  private _filter: HTMLInputElement;
  private _status: HTMLDivElement;
  private _active: IGroup;
  private _resumable: IGroup;
  private _finished: IGroup;
  private _gpus: HTMLDivElement;
  private _folded: boolean | null = null;
  private _rows = new Map<string, HTMLLIElement>();
  private _busy = new Map<string, RunAction>();
}
