// Client of the server extension's REST API (nbtrain/server/handlers.py).
// ServerConnection adds the token and the XSRF header, so POSTs pass the server's checks.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { KeyMap } from './logic';

export interface IRunInfo {
  id: string;
  name: string;
  run_dir: string;
  created: number;
  state: string;
  done: boolean;
  step: number;
  max_steps: number | null;
  loss: number | null;
  // The run's loss history, thinned evenly to a few dozen points (the sidebar's sparkline).
  losses: number[];
  error: { type?: string; message?: string } | null;
  updated: number | null;
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

export function runAction(
  runId: string,
  action: 'stop' | 'checkpoint'
): Promise<IRunInfo> {
  return requestAPI<IRunInfo>(
    `runs/${encodeURIComponent(runId)}/${action}`,
    { method: 'POST', body: '{}' }
  );
}
