// Status-bar item: how many runs are active and how much GPU memory is in use; a click shows the sidebar.
import { Widget } from '@lumino/widgets';

import { activeRunsText, formatBytes, gpuTooltip } from './logic';
import { RunsModel } from './model';

export class RunsStatus extends Widget {
  constructor(model: RunsModel, onClick: () => void) {
    super();
    this._model = model;
    this.addClass('nbtrain-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        onClick();
      }
    });
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const active = this._model.activeRuns.length;
    const parts = [activeRunsText(active, this._model.servingRuns.length)];
    const { gpus, error } = this._model.gpus;
    if (gpus.length > 0) {
      const used = gpus.reduce((s, g) => s + g.memory_used, 0);
      const total = gpus.reduce((s, g) => s + g.memory_total, 0);
      parts.push(`GPU ${formatBytes(used)} / ${formatBytes(total)}`);
    }
    this.node.textContent = parts.join(' · ');
    this.node.title = `${gpuTooltip(gpus, error)}\nClick to show the training runs`;
  }

  private _model: RunsModel;
}
