// Status-bar item: how many runs are active and how much GPU memory is in use.
import { Widget } from '@lumino/widgets';

import { activeRunsText, formatBytes } from './logic';
import { RunsModel } from './model';

export class RunsStatus extends Widget {
  constructor(model: RunsModel) {
    super();
    this._model = model;
    this.addClass('nbtrain-status');
    this.addClass('jp-StatusBar-TextItem');
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const active = this._model.activeRuns.length;
    const parts = [activeRunsText(active)];
    const gpus = this._model.gpus.gpus;
    if (gpus.length > 0) {
      const used = gpus.reduce((s, g) => s + g.memory_used, 0);
      const total = gpus.reduce((s, g) => s + g.memory_total, 0);
      parts.push(`GPU ${formatBytes(used)} / ${formatBytes(total)}`);
    }
    this.node.textContent = parts.join(' · ');
    this.node.title = gpus.length
      ? gpus
          .map(
            g =>
              `GPU ${g.index} ${g.name}: ${formatBytes(g.memory_used)} / ${formatBytes(g.memory_total)}`
          )
          .join('\n')
      : this._model.gpus.error ?? 'no GPU';
  }

  private _model: RunsModel;
}
