// The extension's logic that does not touch JupyterLab or the DOM: completion of %%finetune YAML keys,
// sparkline geometry and number formatting. Kept free of @jupyterlab imports so `npm test` runs it in
// plain node (test/logic.test.ts).

export interface IKeyInfo {
  type: string[];
  enum: unknown[] | null;
  default?: unknown;
  description?: string;
}

export type KeyMap = { [path: string]: IKeyInfo };

const FINETUNE_RE = /^\s*%%finetune\b/;

export function isFinetuneSource(source: string): boolean {
  return FINETUNE_RE.test(source);
}

const KEY_LINE = /^(\s*)([\w.-]*)$/;
const VALUE_LINE = /^(\s*)([\w.-]+):\s*([\w.+-]*)$/;
const PARENT_LINE = /^(\s*)([\w.-]+):\s*(#.*)?$/;
const OBJECTIVE_LINE = /^objective:\s*['"]?([\w-]+)['"]?\s*(#.*)?$/m;

/** The key path above a line with this indentation: the `key:` lines that open its YAML blocks. */
export function parentPath(lines: string[], indent: number): string[] {
  const path: string[] = [];
  let current = indent;
  for (let i = lines.length - 1; i >= 0 && current > 0; i--) {
    const m = PARENT_LINE.exec(lines[i]);
    if (m && m[1].length < current) {
      path.unshift(m[2]);
      current = m[1].length;
    }
  }
  return path;
}

/** The top-level `objective:` a cell names, or null (the validator's default, sft). */
export function objectiveOf(text: string): string | null {
  const m = OBJECTIVE_LINE.exec(text);
  return m ? m[1] : null;
}

/**
 * The keys the validator accepts for this cell: `train.*` comes from the TRL config of the objective the
 * cell names (DPOConfig for `objective: dpo`, ...), everything else from the common schema.
 */
export function keysFor(
  text: string,
  keys: KeyMap,
  objectives?: { [objective: string]: KeyMap }
): KeyMap {
  const objective = objectiveOf(text);
  const own = objective && objectives ? objectives[objective] : undefined;
  if (!own) {
    return keys;
  }
  const out: KeyMap = {};
  for (const [path, info] of Object.entries(keys)) {
    if (!path.startsWith('train.')) {
      out[path] = info;
    }
  }
  return Object.assign(out, own);
}

export interface ICompletionItem {
  label: string;
  insertText: string;
  type: string;
  documentation?: string;
}

export interface ICompletionResult {
  start: number;
  end: number;
  items: ICompletionItem[];
}

/** Config keys or values to offer at ``offset`` in a %%finetune cell's text. */
export function completeFinetune(
  text: string,
  offset: number,
  keys: KeyMap,
  objectives?: { [objective: string]: KeyMap }
): ICompletionResult {
  const none = { start: offset, end: offset, items: [] };
  const before = text.slice(0, offset);
  const lines = before.split('\n');
  if (lines.length < 2 || !isFinetuneSource(text)) {
    return none; // the magic line itself takes options, not keys
  }
  const known = keysFor(text, keys, objectives);
  const line = lines[lines.length - 1];
  const above = lines.slice(1, -1);
  const keyMatch = KEY_LINE.exec(line);
  if (keyMatch) {
    const [, indent, word] = keyMatch;
    const parent = parentPath(above, indent.length).join('.');
    const prefix = parent ? parent + '.' : '';
    const items = Object.entries(known)
      .filter(([path]) => path.startsWith(prefix))
      .map(([path, info]) => [path.slice(prefix.length), info] as const)
      .filter(([name]) => !name.includes('.') && name.startsWith(word))
      .map(([name, info]) => ({
        label: name,
        insertText: `${name}: `,
        type: 'key',
        documentation: info.description
      }))
      .sort((a, b) => a.label.localeCompare(b.label));
    return { start: offset - word.length, end: offset, items };
  }
  const valueMatch = VALUE_LINE.exec(line);
  if (valueMatch) {
    const [, indent, key, value] = valueMatch;
    const path = [...parentPath(above, indent.length), key].join('.');
    const values = (known[path]?.enum ?? []).map(v => String(v));
    const items = values
      .filter(v => v.startsWith(value))
      .map(v => ({ label: v, insertText: v, type: 'value' }));
    return { start: offset - value.length, end: offset, items };
  }
  return none;
}

/**
 * An SVG path (`M x y L x y ...`) drawing ``values`` left to right in a ``width`` x ``height`` box,
 * the largest value at the top; non-finite values (a diverged loss) are skipped. '' when fewer than two
 * points remain.
 */
export function sparklinePath(values: number[], width: number, height: number): string {
  const pts = values.map((v, i) => [i, v] as const).filter(([, v]) => Number.isFinite(v));
  if (pts.length < 2) {
    return '';
  }
  const lo = Math.min(...pts.map(([, v]) => v));
  const hi = Math.max(...pts.map(([, v]) => v));
  const span = hi - lo || 1;
  const last = values.length - 1;
  const pad = 1; // keep the stroke inside the box
  return pts
    .map(([i, v], k) => {
      const x = (i / last) * width;
      const y = pad + (1 - (v - lo) / span) * (height - 2 * pad);
      return `${k === 0 ? 'M' : 'L'}${x.toFixed(1)} ${y.toFixed(1)}`;
    })
    .join(' ');
}

export function formatBytes(n: number): string {
  const gib = n / 1024 ** 3;
  return gib >= 10 ? `${gib.toFixed(0)} GiB` : `${gib.toFixed(1)} GiB`;
}

/** Fraction of the run done (0..1), for the progress bar; 0 when the length is unknown. */
export function progressFraction(step: number, maxSteps: number | null): number {
  return maxSteps ? Math.max(0, Math.min(1, step / maxSteps)) : 0;
}

/** What a view says while a run has no logged step yet (the dashboard's own words, figures/charts.py). */
export function waitingText(state: string, phase: string | null): string {
  if (phase) {
    return phase;
  }
  const words: { [state: string]: string } = {
    queued: 'queued: waiting to start',
    starting: 'starting the training process',
    running: 'training: waiting for the first logged step',
    stopping: 'stopping',
    stopped: 'stopped before the first step',
    completed: 'completed without a logged step'
  };
  return words[state] ?? state;
}

/**
 * The state a run's chip shows: "stopping" from the moment a stop is asked for (the run still finishes its
 * step and saves a checkpoint, its status says "running" meanwhile), else the run's own state.
 */
/** The Stop button's tooltip, and its tooltip while the stop is under way (sidebar and run page). */
export const STOP_TIP = 'Finish the step in progress, save a checkpoint, then stop (Resume continues from it)';
export const STOPPING_TIP =
  'Stopping: finishing the step in progress, then saving a checkpoint (Resume continues from it)';

export function chipState(state: string, stopping: boolean): string {
  return stopping && (state === 'running' || state === 'stopping') ? 'stopping' : state;
}

/** A count with thousands separators, as the dashboard writes it ("step 1,401/100,000"). */
export function count(n: number): string {
  return n.toLocaleString('en-US');
}

export function stepsText(step: number, maxSteps: number | null): string {
  return maxSteps ? `step ${count(step)}/${count(maxSteps)}` : `step ${count(step)}`;
}

/**
 * A running run's line: its steps, then what the server estimated (control/runs/eta, the words the cell's
 * header uses too): the time left and, before its first loss, when that comes. "step 2/100 · 32 min 40 s
 * left · first loss at step 5, in about 60 s"; the parts the server left out are left out.
 */
export function progressLine(steps: string, leftText?: string | null, firstLossText?: string | null): string {
  return [steps, leftText, firstLossText].filter(part => !!part).join(' · ');
}

export function activeRunsText(active: number, servers = 0): string {
  const runs = `nbtrain: ${active} active run${active === 1 ? '' : 's'}`;
  return servers > 0 ? `${runs} · ${servers} model server${servers === 1 ? '' : 's'}` : runs;
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/**
 * When a run started, short and in local time: "today 14:03", "3 Jan 14:03", "3 Jan 2024 14:03" (another
 * year). ``created`` is in seconds since the epoch (the registry's); '' when unknown.
 */
export function startedText(created: number | null | undefined, now: Date = new Date()): string {
  if (!created || !Number.isFinite(created)) {
    return '';
  }
  const d = new Date(created * 1000);
  const hm = `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
  const sameYear = d.getFullYear() === now.getFullYear();
  if (sameYear && d.getMonth() === now.getMonth() && d.getDate() === now.getDate()) {
    return `today ${hm}`;
  }
  const day = `${d.getDate()} ${MONTHS[d.getMonth()]}`;
  return sameYear ? `${day} ${hm}` : `${day} ${d.getFullYear()} ${hm}`;
}

export interface IFilterable {
  id: string;
  name: string;
  state: string;
  folder?: string;
  model?: string;
  sweep?: { id: string; name: string; trial: number } | null;
}

/** Whether a run matches the sidebar's filter box: every word of it, in its name, id, state, folder,
 * model or sweep ("sweep lr"). */
export function matchesFilter(run: IFilterable, query: string): boolean {
  const sweep = run.sweep ? `sweep ${run.sweep.name} ${run.sweep.id}` : '';
  const hay = `${run.name} ${run.id} ${run.state} ${run.folder ?? ''} ${run.model ?? ''} ${sweep}`.toLowerCase();
  return query
    .toLowerCase()
    .split(/\s+/)
    .filter(w => w.length > 0)
    .every(w => hay.includes(w));
}

/** The runs in the order given, except that a sweep's trials sit together, by trial number, where its first
 * trial in the order is. */
export function withSweepsTogether<T extends { sweep?: { id: string; trial: number } | null }>(runs: T[]): T[] {
  const bySweep = new Map<string, T[]>();
  for (const r of runs) {
    if (r.sweep) {
      const trials = bySweep.get(r.sweep.id) ?? [];
      trials.push(r);
      bySweep.set(r.sweep.id, trials);
    }
  }
  const out: T[] = [];
  for (const r of runs) {
    if (!r.sweep) {
      out.push(r);
    } else if (bySweep.has(r.sweep.id)) {
      out.push(...bySweep.get(r.sweep.id)!.sort((a, b) => a.sweep!.trial - b.sweep!.trial));
      bySweep.delete(r.sweep.id);
    }
  }
  return out;
}

export interface IGroupable {
  done: boolean;
  resumable: boolean;
  // The run's model server while one runs (an ended run's too): such a run counts as active.
  server?: unknown;
}

/** The sidebar's groups, each in the order given: runs going on, and ended runs whose model server still
 * runs (a process holding memory: never folded away); ended runs that Resume can continue (stopped, or
 * failed with a checkpoint: a group that never folds, so the run you just stopped stays in sight); and the
 * other ended ones. */
export function groupRuns<T extends IGroupable>(runs: T[]): { active: T[]; resumable: T[]; finished: T[] } {
  const live = (r: T) => !r.done || !!r.server;
  return {
    active: runs.filter(live),
    resumable: runs.filter(r => !live(r) && r.resumable),
    finished: runs.filter(r => !live(r) && !r.resumable)
  };
}

/** More finished runs than this start folded away (until the user opens or closes the group). */
export const FOLD_FINISHED_OVER = 5;

/** The status bar's tooltip about GPUs: per GPU its memory, or why there is none, in plain words. */
export function gpuTooltip(
  gpus: { index: number; name: string; memory_used: number; memory_total: number }[],
  error: string | null
): string {
  if (gpus.length > 0) {
    return gpus
      .map(g => `GPU ${g.index} ${g.name}: ${formatBytes(g.memory_used)} / ${formatBytes(g.memory_total)} in use`)
      .join('\n');
  }
  // NVML's own words ("NVML Shared Library Not Found", "Driver Not Loaded") mean no usable NVIDIA GPU here.
  if (!error || /no nvidia|not found|driver not loaded|no supported gpu/i.test(error)) {
    return 'No NVIDIA GPU on this machine';
  }
  return `GPU memory cannot be read: ${error}`;
}

/**
 * The cell that shows a run's dashboard: `%finetune attach RUN`, after `%load_ext nbtrain` when the kernel
 * lacks the magics (a restarted kernel, a new notebook) or did not say (null), so the cell works whatever
 * ran before it.
 */
export function attachSource(runId: string, loaded: boolean | null): string {
  return (loaded ? '' : '%load_ext nbtrain\n') + `%finetune attach ${runId}`;
}

/** A plotly figure as JSON (what the server's runs/<id>/figure answers). */
export interface IFigureJSON {
  data: { [attr: string]: unknown }[];
  layout: { [key: string]: unknown };
}

/** One of a figure's controls (a plotly updatemenu: the loss panel's linear/log and raw/smoothed). */
export interface IFigureMenu {
  name?: string;
  active?: number;
  buttons?: { method?: string; args?: unknown[] }[];
}

function setPath(target: { [key: string]: unknown }, path: string, value: unknown): void {
  const keys = path.split('.');
  let node = target;
  for (const key of keys.slice(0, -1)) {
    const next = node[key];
    node = (node[key] = next && typeof next === 'object' ? next : {}) as { [key: string]: unknown };
  }
  node[keys[keys.length - 1]] = value;
}

/** The choices made in a figure's controls (``previous``: the drawn figure's menus), carried onto a fresh
 * figure of the same run before it is drawn: each menu keeps its active button, and what that button sets
 * (a relayout's layout keys, a restyle's trace attributes, an array value cycled over its traces as plotly
 * does) is set in the new figure, as a click on it would. */
export function carryControls(previous: IFigureMenu[] | undefined, figure: IFigureJSON): void {
  const menus = figure.layout.updatemenus as IFigureMenu[] | undefined;
  for (const menu of menus ?? []) {
    const active = previous?.find(m => m.name === menu.name)?.active;
    const button = typeof active === 'number' ? menu.buttons?.[active] : undefined;
    if (active === undefined || active === menu.active || !button) {
      continue;
    }
    menu.active = active;
    const [values, traces] = (button.args ?? []) as [{ [key: string]: unknown }?, number[]?];
    for (const [key, value] of Object.entries(values ?? {})) {
      if (button.method === 'relayout') {
        setPath(figure.layout, key, value);
      } else if (button.method === 'restyle') {
        const indices = traces ?? figure.data.map((_, i) => i);
        indices.forEach((t, j) => {
          if (figure.data[t]) {
            const v = Array.isArray(value) ? value[j % value.length] : value;
            setPath(figure.data[t], key, v);
          }
        });
      }
    }
  }
}
