// %%finetune cells: YAML highlighting for their body and completion of config keys from GET schema.
import {
  CompletionHandler,
  ICompletionContext,
  ICompletionProvider
} from '@jupyterlab/completer';
import { Cell, ICellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';

import { ISchema, requestAPI } from './api';
import { completeFinetune, isFinetuneSource } from './logic';

const YAML_MIME = 'text/x-yaml';

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

export class FinetuneCompletionProvider implements ICompletionProvider {
  readonly identifier = 'nbtrain:finetune-keys';
  readonly rank = 800; // above the kernel's completions, which know nothing of the YAML body

  isApplicable(context: ICompletionContext): Promise<boolean> {
    const editor = context.editor;
    return Promise.resolve(
      !!editor && isFinetuneSource(editor.model.sharedModel.getSource())
    );
  }

  async fetch(
    request: CompletionHandler.IRequest,
    _context: ICompletionContext
  ): Promise<CompletionHandler.ICompletionItemsReply> {
    const schema = await getSchema();
    return completeFinetune(request.text, request.offset, schema.keys, schema.objectives);
  }
}
