/**
 * The server extension's API (pdl_lab.handlers): GET /pdl/api/cluster,
 * POST /pdl/api/stop, POST /pdl/api/restart, POST /pdl/api/extend. Field meanings: docs/cluster-panel.md.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export type EngineState = 'idle' | 'busy' | 'dead' | 'starting';

export interface IGpu {
  index: string;
  uuid: string;
  name: string;
  util_percent: number | null;
  mem_used_bytes: number | null;
  mem_total_bytes: number | null;
}

export interface IEngine {
  id: number | null;
  slot: string;
  host: string | null;
  pid: number | null;
  state: EngineState;
  rank: number | null;
  local: boolean;
  cuda_visible: string | null;
  cpu_percent: number | null;
  rss_bytes: number | null;
  gpus: IGpu[];
}

export interface IRankProgress {
  rank: number;
  engine_id: number;
  host: string | null;
  slot: string | null;
  step: number | null;
  total: number | null;
  values: { [name: string]: number };
  time: number | null;
  history: [number, { [name: string]: number }][];
}

export interface ICell {
  number: number;
  running: boolean;
  kernel_pid: number;
  started: number | null;
  updated: number | null;
  ranks: IRankProgress[];
}

export interface ISession {
  ends_at: number;
  left_s: number;
  why: string;
  /** "Time left: 9 min (why)" */
  text: string;
  /** One line once less than the warning time is left, else null. */
  warning: string | null;
  /** True where the hub lets the user ask for more time (the Extend button). */
  extendable: boolean;
  /** Where the last wish for more time stands, one line, or null. */
  extension: string | null;
}

export interface IExtendReply {
  ok: boolean;
  message: string;
}

export interface ICluster {
  mode: 'hub' | 'local' | 'none';
  connected: boolean;
  message: string | null;
  /** Under the hub: "You may hold N workers; you hold M." and the scheduler's limits. */
  limits: string | null;
  /** Under the hub, where the session has an end (Slurm: its job's time limit). */
  session: ISession | null;
  /** Under the hub: its flag on GPUs held idle (0 % use), one line, or null. */
  gpu_idle: string | null;
  /** the type of the GPUs reserved (Slurm's GRES type, nvidia-smi's name on one machine); null: any */
  gpu_type: string | null;
  cluster_file: string | null;
  slots: string[];
  nodes: string[];
  engines: IEngine[];
  cell: ICell | null;
  time: number;
}

export interface IStopReply {
  kernel_pid: number | null;
  signalled_engines: number[];
}

export interface IRestartReply {
  killed: number[];
  skipped: number[];
  restarted_by: string | null;
  message: string | null;
}

/** Call /pdl/api/<endpoint>; throws ServerConnection.ResponseError on a non-2xx reply. */
export async function requestAPI<T>(endpoint: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'pdl', 'api', endpoint);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, text);
  }
  return JSON.parse(text) as T;
}
