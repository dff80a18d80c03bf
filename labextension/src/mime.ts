// The MIME extensions (package.json's jupyterlab.mimeExtension): nbtrain's run view and sweep view, ranked
// above plotly's renderer (rank 2) so a notebook shows it, not the static figure, for the outputs that carry it, and the
// run record line with the run's state now. Other frontends (VS Code, nbconvert) do not know the types and
// show the plotly JSON or HTML beside them.
import { RECORD_MIME, RecordLine } from './recordline';
import { RUN_VIEW_MIME, RunView } from './runview';
import { SWEEP_VIEW_MIME, SweepView } from './sweepview';

const extensions = [
  {
    id: 'nbtrain:run-view',
    rendererFactory: {
      safe: true,
      mimeTypes: [RUN_VIEW_MIME],
      createRenderer: () => new RunView()
    },
    rank: 0,
    dataType: 'json' as const
  },
  {
    id: 'nbtrain:sweep-view',
    rendererFactory: {
      safe: true,
      mimeTypes: [SWEEP_VIEW_MIME],
      createRenderer: () => new SweepView()
    },
    rank: 0,
    dataType: 'json' as const
  },
  {
    id: 'nbtrain:run-record',
    rendererFactory: {
      safe: true,
      mimeTypes: [RECORD_MIME],
      createRenderer: () => new RecordLine()
    },
    rank: 0,
    dataType: 'json' as const
  }
];

export default extensions;
