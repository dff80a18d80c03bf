// %%finetune cells: YAML highlighting for their body and completion of config keys from GET schema.
import {
  CompletionHandler,
  ICompletionContext,
  ICompletionProvider
} from '@jupyterlab/completer';
import { Cell, ICellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';

import { IKeyInfo, ISchema, requestAPI } from './api';

const FINETUNE_RE = /^\s*%%finetune\b/;
const YAML_MIME = 'text/x-yaml';

export function isFinetuneSource(source: string): boolean {
  return FINETUNE_RE.test(source);
}

/**
 * Keep every %%finetune cell of a notebook in YAML mode.
 *
 * IPython has no per-cell language, and the notebook resets each code cell's mime type when a cell is
 * created or the kernel's language info arrives; so each cell watches its own source and mime type and
 * switches back to YAML whenever it starts with %%finetune (and back to the kernel's language when not).
 */
export function highlightFinetuneCells(panel: NotebookPanel): void {
  const watched = new WeakSet<ICellModel>();
  const kernelMime = new WeakMap<ICellModel, string>();

  const sync = (model: ICellModel) => {
    if (model.type !== 'code') {
      return;
    }
    const want = isFinetuneSource(model.sharedModel.getSource());
    if (want && model.mimeType !== YAML_MIME) {
      kernelMime.set(model, model.mimeType);
      model.mimeType = YAML_MIME;
    } else if (!want && model.mimeType === YAML_MIME && kernelMime.has(model)) {
      model.mimeType = kernelMime.get(model)!;
    }
  };
  const watch = (cell: Cell) => {
    const model = cell.model;
    if (watched.has(model)) {
      return;
    }
    watched.add(model);
    model.contentChanged.connect(() => sync(model));
    model.mimeTypeChanged.connect((_, change) => {
      if (change.newValue !== YAML_MIME) {
        kernelMime.set(model, change.newValue);
        sync(model);
      }
    });
    sync(model);
  };
  const watchAll = () => panel.content.widgets.forEach(watch);
  void panel.context.ready.then(() => {
    watchAll();
    panel.content.model?.cells.changed.connect(() =>
      // The cell widget for a new model exists only after the notebook has handled the change.
      requestAnimationFrame(watchAll)
    );
  });
}

let schemaPromise: Promise<ISchema> | null = null;

function getSchema(): Promise<ISchema> {
  if (!schemaPromise) {
    schemaPromise = requestAPI<ISchema>('schema').catch(e => {
      schemaPromise = null; // try again on the next completion request
      throw e;
    });
  }
  return schemaPromise;
}

const KEY_LINE = /^(\s*)([\w.-]*)$/;
const VALUE_LINE = /^(\s*)([\w.-]+):\s*([\w.+-]*)$/;
const PARENT_LINE = /^(\s*)([\w.-]+):\s*(#.*)?$/;

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

export interface ICompletionResult {
  start: number;
  end: number;
  items: { label: string; insertText: string; type: string; documentation?: string }[];
}

/** Config keys or values to offer at ``offset`` in a %%finetune cell's text (pure, for testing). */
export function completeFinetune(
  text: string,
  offset: number,
  keys: { [path: string]: IKeyInfo }
): ICompletionResult {
  const none = { start: offset, end: offset, items: [] };
  const before = text.slice(0, offset);
  const lines = before.split('\n');
  if (lines.length < 2 || !isFinetuneSource(text)) {
    return none; // the magic line itself takes options, not keys
  }
  const line = lines[lines.length - 1];
  const above = lines.slice(1, -1);
  const keyMatch = KEY_LINE.exec(line);
  if (keyMatch) {
    const [, indent, word] = keyMatch;
    const parent = parentPath(above, indent.length).join('.');
    const prefix = parent ? parent + '.' : '';
    const items = Object.entries(keys)
      .filter(([path]) => path.startsWith(prefix))
      .map(([path, info]) => [path.slice(prefix.length), info] as const)
      .filter(([name]) => !name.includes('.') && name.startsWith(word))
      .map(([name, info]) => ({
        label: name,
        insertText: `${name}: `,
        type: 'key',
        documentation: info.description
      }));
    return { start: offset - word.length, end: offset, items };
  }
  const valueMatch = VALUE_LINE.exec(line);
  if (valueMatch) {
    const [, indent, key, value] = valueMatch;
    const path = [...parentPath(above, indent.length), key].join('.');
    const values = (keys[path]?.enum ?? []).map(v => String(v));
    const items = values
      .filter(v => v.startsWith(value))
      .map(v => ({ label: v, insertText: v, type: 'value' }));
    return { start: offset - value.length, end: offset, items };
  }
  return none;
}

export class FinetuneCompletionProvider implements ICompletionProvider {
  readonly identifier = 'nbtrain:finetune-keys';
  readonly rank = 800; // above the kernel's completions, which know nothing of the YAML body

  async isApplicable(context: ICompletionContext): Promise<boolean> {
    const editor = context.editor;
    return !!editor && isFinetuneSource(editor.model.sharedModel.getSource());
  }

  async fetch(
    request: CompletionHandler.IRequest,
    _context: ICompletionContext
  ): Promise<CompletionHandler.ICompletionItemsReply> {
    const schema = await getSchema();
    return completeFinetune(request.text, request.offset, schema.keys);
  }
}
