// Client of the server extension's REST API (nbtrain/ui/server/handlers.py).
// ServerConnection adds the token and the XSRF header, so POSTs pass the server's checks.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { KeyMap } from './logic';

export interface IRunInfo {
  id: string;
  name: string;
  run_dir: string;
  // The model it trains: a Hub id, or a local folder's or file's name ("" when unknown).
  model: string;
  // The folder holding the run directory, as shown: relative to the server's root ("runs"), or "~/...".
  folder: string;
  // When the run was created (seconds since the epoch).
  created: number;
  // Whether Resume can continue it (stopped or failed, with a complete checkpoint); else why not.
  resumable: boolean;
  resume_note: string | null;
  state: string;
  // While starting: what the worker is doing ("downloading model org/x 3.1 / 15.2 GB, 40 MB/s").
  phase: string | null;
  // A stop is under way: asked for, and the run is finishing its step and saving its checkpoint.
  stopping?: boolean;
  done: boolean;
  step: number;
  max_steps: number | null;
  loss: number | null;
  // The run's loss history, thinned evenly to a few dozen points (the sidebar's sparkline).
  losses: number[];
  // While it trains (the server's estimate, control/runs/eta, null until two steps are timed): seconds to
  // its last step and in words ("32 min 40 s left"); before its first loss, when that comes ("first loss
  // at step 5, in about 60 s").
  left?: number | null;
  left_text?: string | null;
  first_loss_text?: string | null;
  error: { type?: string; message?: string } | null;
  updated: number | null;
  // Its OpenAI-compatible model server while one runs (never its key): url null with a note when the
  // server is another user's.
  server: { url: string | null; pid?: number; engine?: string; device?: string; note?: string } | null;
  // A sweep's trial: which sweep and trial (its card says so, and sits with its sweep's other trials).
  sweep?: { id: string; name: string; trial: number } | null;
}

export interface IGpuInfo {
  index: number;
  name: string;
  memory_total: number;
  memory_used: number;
}

export interface IGpus {
  gpus: IGpuInfo[];
  error: string | null;
  sampled: number | null;
}

export interface ISchema {
  schema: unknown;
  keys: KeyMap;
  // Per objective (sft, dpo, ...): the train.* keys its TRL config accepts.
  objectives: { [objective: string]: KeyMap };
}

export async function requestAPI<T>(
  endPoint: string,
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nbtrain', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: unknown = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    // Tornado's HTTPError reply carries the handler's reason in `message`.
    const message = (data as { message?: unknown } | null)?.message;
    throw new ServerConnection.ResponseError(
      response,
      (typeof message === 'string' && message) || text || response.statusText
    );
  }
  return data as T;
}

export type RunAction = 'stop' | 'checkpoint' | 'resume' | 'delete' | 'server/stop';

/** POST runs/ID/ACTION. Stop waits until the run has saved its checkpoint and exited; server/stop until its
 * model server has exited; delete answers {id, trash} (where the run directory went), the others the run's
 * new status. */
export function runAction<T = IRunInfo>(runId: string, action: RunAction): Promise<T> {
  return requestAPI<T>(`runs/${encodeURIComponent(runId)}/${action}`, {
    method: 'POST',
    body: '{}'
  });
}
