// A run's charts as a notebook's dashboard draws them: the server's runs/<id>/figure is that very plotly
// figure (nbtrain.ui.figures, built from the run directory through the one metrics reader: loss with eval
// loss, learning rate, gradient norm, throughput, memory; the loss panel's linear/log and raw/smoothed
// controls), drawn here with the plotly renderer JupyterLab and Notebook 7 already have (plotly's own lab
// extension, registered for application/vnd.plotly.v1+json). No chart is drawn in TypeScript.
//
// The first figure goes through that renderer; later ones are drawn in place with the plotly.js it loaded
// (Plotly.react), without flicker: the figure's uirevision keeps the user's zoom and the legend's hidden
// traces, and carryControls the choices made in its controls. Asked with the version it drew, the server
// answers no figure while nothing in it changed.
import { IRenderMimeRegistry, MimeModel } from '@jupyterlab/rendermime';
import type { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { carryControls, IFigureJSON, IFigureMenu } from './logic';

export const PLOTLY_MIME = 'application/vnd.plotly.v1+json';
// not plotly's responsive mode: it sizes the plot to its container's height, which here follows the plot
const CONFIG = { displaylogo: false };

// Set by the plugin (index.ts): the application's renderers, plotly's among them.
let renderers: IRenderMimeRegistry | null = null;
export function setRenderers(registry: IRenderMimeRegistry | null): void {
  renderers = registry;
}

export const NO_PLOTLY =
  "The charts need plotly's JupyterLab extension, which comes with the plotly package: install plotly " +
  '(pip install plotly) where this Jupyter server runs, restart the server and reload the page.';

/** The plotly.js functions used here; plotly's renderer class keeps the library it loaded as ``Plotly``. */
interface IPlotly {
  react(node: HTMLElement, data: unknown, layout: unknown, config: unknown): Promise<unknown>;
  Plots: { resize(node: HTMLElement): void };
}

export interface IFigureReply {
  version: string;
  caught_up?: boolean;
  figure: IFigureJSON | null;
}

/** The dashboard figure of one run (or, ``route`` "sweeps", of a sweep), drawn into ``host`` and kept up
 * to date by ``update()``. */
export class RunFigure {
  constructor(
    readonly runId: string,
    private readonly host: HTMLElement,
    private readonly route: 'runs' | 'sweeps' = 'runs'
  ) {}

  /** Read the figure (what is new since the last read) and draw it if it changed; the server's last
   * answer. Throws what the server answered when it cannot. */
  async update<T extends IFigureReply = IFigureReply>(): Promise<T | null> {
    let reply: T | null = null;
    for (let i = 0; i < 20; i++) {
      const since = this._version ? `?since=${encodeURIComponent(this._version)}` : '';
      const id = encodeURIComponent(this.runId);
      reply = await requestAPI<T>(`${this.route}/${id}/figure${since}`);
      if (reply.figure && (await this._draw(reply.figure))) {
        this._version = reply.version;
      }
      if (reply.caught_up !== false) {
        break;
      }
    }
    return reply;
  }

  /** Fit the figure to its host's width (the page was resized, or the sidebar beside it); a figure read
   * while the host was hidden is drawn now. */
  resize(): void {
    if (this.host.offsetWidth === 0) {
      return;
    }
    if (this._pending) {
      this._pending = false;
      void this.update().catch(() => undefined); // the page's next read says what went wrong
    } else if (this._plotly && this._renderer) {
      this._plotly.Plots.resize(this._renderer.node);
    }
  }

  dispose(): void {
    this._renderer?.dispose();
    this._renderer = null;
  }

  /** Whether ``figure`` is drawn (not while the host is off the page or hidden: plotly measures it). */
  private async _draw(figure: IFigureJSON): Promise<boolean> {
    if (!this.host.isConnected || this.host.offsetWidth === 0) {
      this._pending = true;
      return false;
    }
    if (this._renderer && this._plotly) {
      const node = this._renderer.node as HTMLElement & { layout?: { updatemenus?: IFigureMenu[] } };
      carryControls(node.layout?.updatemenus, figure);
      await this._plotly.react(node, figure.data, figure.layout, CONFIG);
      return true;
    }
    this._renderer?.dispose(); // a renderer whose plotly.js is not at hand: drawn anew (it then flickers)
    if (!renderers?.mimeTypes.includes(PLOTLY_MIME)) {
      this.host.textContent = NO_PLOTLY;
      this.host.classList.add('nbtrain-figure-missing');
      return false;
    }
    const renderer = renderers.createRenderer(PLOTLY_MIME);
    renderer.addClass('nbtrain-figure-plot');
    Widget.attach(renderer, this.host);
    const bundle = { [PLOTLY_MIME]: { ...figure, config: CONFIG } } as unknown as ReadonlyPartialJSONObject;
    await renderer.renderModel(new MimeModel({ data: bundle }));
    this._renderer = renderer;
    this._plotly = (renderer.constructor as unknown as { Plotly?: IPlotly | null }).Plotly ?? null;
    return true;
  }

  private _renderer: Widget | null = null;
  private _plotly: IPlotly | null = null;
  private _version = '';
  private _pending = false; // a figure came while the host was hidden
}
