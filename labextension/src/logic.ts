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

export function stepsText(step: number, maxSteps: number | null): string {
  return maxSteps ? `step ${step}/${maxSteps}` : `step ${step}`;
}

export function activeRunsText(active: number): string {
  return `nbtrain: ${active} active run${active === 1 ? '' : 's'}`;
}
