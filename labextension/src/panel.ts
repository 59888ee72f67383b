/**
 * The Cluster panel: reserved slots and nodes, each engine's state and load, the
 * running cell's progress per rank, and the Stop cell / Restart engines buttons.
 * It polls GET /pdl/api/cluster while it is visible.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import {
  ICluster,
  IEngine,
  IExtendReply,
  IRankProgress,
  IRestartReply,
  IStopReply,
  requestAPI
} from './api';

/** Poll period (ms) when the settings do not say. */
export const DEFAULT_REFRESH_MS = 1000;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

/** 1536 -> "1.5 KiB". */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || bytes === undefined) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

function formatNumber(v: number): string {
  if (!isFinite(v)) {
    return String(v);
  }
  return Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(4).replace(/\.?0+$/, '');
}

/** The metric shown as throughput: img/s, images_per_sec, samples_per_s... */
function throughputKey(values: { [k: string]: number }): string | undefined {
  return Object.keys(values).find(k => /img|image|sample|throughput/i.test(k));
}

function lossKey(values: { [k: string]: number }): string | undefined {
  return 'loss' in values ? 'loss' : Object.keys(values).find(k => /loss/i.test(k));
}

/** One line for a rank: "step 12/40 · loss 0.33 · 512 img/s". */
export function progressText(r: IRankProgress): string {
  if (r.step === null || r.step === undefined) {
    return 'no pdl.log yet';
  }
  const parts = [r.total ? `step ${r.step}/${r.total}` : `step ${r.step}`];
  const loss = lossKey(r.values);
  const tput = throughputKey(r.values);
  if (loss !== undefined) {
    parts.push(`${loss} ${formatNumber(r.values[loss])}`);
  }
  if (tput !== undefined) {
    parts.push(`${formatNumber(r.values[tput])} img/s`);
  }
  for (const k of Object.keys(r.values)) {
    if (k !== loss && k !== tput && parts.length < 5) {
      parts.push(`${k} ${formatNumber(r.values[k])}`);
    }
  }
  return parts.join(' · ');
}

export class ClusterPanel extends Widget {
  constructor() {
    super();
    this.id = 'pdl-cluster-panel';
    this.addClass('pdl-ClusterPanel');
    this.title.caption = 'Cluster';

    const header = el('div', 'pdl-header');
    header.appendChild(el('h2', 'pdl-title', 'Cluster'));
    const buttons = el('div', 'pdl-buttons');
    this._stopButton = el('button', 'jp-Button jp-mod-styled jp-mod-warn pdl-stop', 'Stop cell');
    this._stopButton.title = 'Interrupt the running %%distributed cell on every rank';
    this._stopButton.onclick = () => void this.stopCell();
    this._restartButton = el('button', 'jp-Button jp-mod-styled jp-mod-reject pdl-restart', 'Restart engines');
    this._restartButton.title = 'Kill every engine and start fresh ones (their variables are lost)';
    this._restartButton.onclick = () => void this.restartEngines();
    buttons.append(this._stopButton, this._restartButton);
    header.appendChild(buttons);

    this._summary = el('div', 'pdl-summary');
    this._notice = el('div', 'pdl-notice');
    this._engines = el('div', 'pdl-engines');
    this._cell = el('div', 'pdl-cell');
    this.node.append(header, this._summary, this._notice, this._engines, this._cell);
  }

  /** Poll period in ms (from the settings). */
  get refreshMs(): number {
    return this._refreshMs;
  }
  set refreshMs(ms: number) {
    this._refreshMs = Math.max(250, ms || DEFAULT_REFRESH_MS);
  }

  /** The last model received, if any. */
  get model(): ICluster | null {
    return this._model;
  }

  async refresh(): Promise<void> {
    try {
      this.render(await requestAPI<ICluster>('cluster'));
    } catch (reason) {
      this._notice.textContent = `Cluster status unavailable: ${reason}`;
      this._notice.classList.add('pdl-mod-error');
    }
  }

  /** Ask the hub for more time; its answer shows in the session's lines at the next refreshes. */
  async extendSession(button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    try {
      const reply = await requestAPI<IExtendReply>('extend', { method: 'POST' });
      this.setNotice(reply.message, !reply.ok);
    } catch (reason) {
      this.setNotice(`Extend failed: ${reason}`, true);
    }
    await this.refresh();
  }

  async stopCell(): Promise<void> {
    this._stopButton.disabled = true;
    this.setNotice('Stopping the cell on every rank…');
    try {
      const reply = await requestAPI<IStopReply>('stop', { method: 'POST' });
      const who = reply.kernel_pid !== null ? 'the kernel and its ranks' : 'the engines';
      const extra = reply.signalled_engines.length
        ? ` (SIGINT to engine${reply.signalled_engines.length > 1 ? 's' : ''} ${reply.signalled_engines.join(', ')})`
        : '';
      this.setNotice(`Stop sent to ${who}${extra}.`);
    } catch (reason) {
      this.setNotice(`Stop failed: ${reason}`, true);
    }
    await this.refresh();
  }

  async restartEngines(): Promise<void> {
    const answer = await showDialog({
      title: 'Restart engines?',
      body: 'Every engine is killed and a fresh one started on its slot: the variables on the engines are lost.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Restart' })]
    });
    if (!answer.button.accept) {
      return;
    }
    this._restartButton.disabled = true;
    try {
      const reply = await requestAPI<IRestartReply>('restart', { method: 'POST' });
      if (reply.message) {
        this.setNotice(reply.message, true);
      } else {
        const skipped = reply.skipped.length
          ? `; engines ${reply.skipped.join(', ')} run on other hosts and were left alone`
          : '';
        this.setNotice(
          `Killed ${reply.killed.length} engine(s); ${reply.restarted_by} starts them again${skipped}.`
        );
      }
    } catch (reason) {
      this.setNotice(`Restart failed: ${reason}`, true);
    }
    this._restartButton.disabled = false;
    await this.refresh();
  }

  private setNotice(text: string, error = false): void {
    this._notice.textContent = text;
    this._notice.classList.toggle('pdl-mod-error', error);
  }

  render(model: ICluster): void {
    this._model = model;
    this._notice.classList.remove('pdl-mod-error');
    if (model.message) {
      this._notice.textContent = model.message;
    } else if (this._notice.textContent?.startsWith('Cluster status unavailable')) {
      this._notice.textContent = '';
    }
    const where = model.mode === 'hub' ? 'Reserved' : model.mode === 'local' ? 'Local pool' : '';
    const gpus = model.gpu_type ? `${model.gpu_type} GPUs` : 'GPUs';
    const kinds = model.slots.some(s => s.startsWith('gpu') || s.startsWith('mig')) ? gpus : 'slots';
    this._summary.replaceChildren();
    if (where) {
      this._summary.appendChild(
        el('div', 'pdl-slots', `${where}: ${model.slots.length} ${kinds}${model.slots.length ? ' (' + model.slots.join(', ') + ')' : ''}`)
      );
    }
    if (model.limits) {
      this._summary.appendChild(el('div', 'pdl-limits', model.limits));
    }
    if (model.session) {
      const timeLeft = el('div', 'pdl-time-left', model.session.text);
      if (model.session.extendable) {
        const extend = el('button', 'jp-Button jp-mod-styled jp-mod-accept pdl-extend', 'Extend');
        extend.title = 'Ask the hub for more time for this session';
        extend.onclick = () => void this.extendSession(extend);
        timeLeft.append(' ', extend);
      }
      this._summary.appendChild(timeLeft);
      if (model.session.warning) {
        this._summary.appendChild(el('div', 'pdl-session-warning pdl-mod-error', model.session.warning));
      }
      if (model.session.extension) {
        this._summary.appendChild(el('div', 'pdl-extension', model.session.extension));
      }
    }
    if (model.gpu_idle) {
      this._summary.appendChild(el('div', 'pdl-gpu-idle pdl-mod-error', model.gpu_idle));
    }
    if (model.nodes.length) {
      this._summary.appendChild(el('div', 'pdl-nodes', `Node${model.nodes.length > 1 ? 's' : ''}: ${model.nodes.join(', ')}`));
    }

    this._engines.replaceChildren(...model.engines.map(e => this.renderEngine(e)));
    if (!model.engines.length && model.mode !== 'none') {
      this._engines.appendChild(el('div', 'pdl-empty', 'No engines registered yet.'));
    }
    this.renderCell(model);

    const busy = model.engines.some(e => e.state === 'busy');
    this._stopButton.disabled = !(busy || model.cell?.running);
    this._restartButton.disabled = !model.engines.some(e => e.state !== 'starting' && e.local);
  }

  private renderEngine(e: IEngine): HTMLElement {
    const card = el('div', `pdl-engine pdl-mod-${e.state}`);
    card.dataset.state = e.state;
    if (e.id !== null) {
      card.dataset.engineId = String(e.id);
    }
    const head = el('div', 'pdl-engine-head');
    head.appendChild(el('span', 'pdl-engine-name', e.id !== null ? `engine ${e.id}` : 'engine'));
    head.appendChild(el('span', 'pdl-engine-where', `${e.slot || '?'}${e.host ? ' @ ' + e.host : ''}`));
    if (e.rank !== null && e.rank !== undefined) {
      head.appendChild(el('span', 'pdl-engine-rank', `rank ${e.rank}`));
    }
    head.appendChild(el('span', `pdl-state pdl-state-${e.state}`, e.state));
    card.appendChild(head);

    const load = el('div', 'pdl-engine-load');
    if (e.state === 'idle' || e.state === 'busy') {
      if (e.local) {
        const cpu = e.cpu_percent === null ? '…' : `${e.cpu_percent.toFixed(0)}%`;
        load.appendChild(el('span', 'pdl-cpu', `CPU ${cpu}`));
        load.appendChild(el('span', 'pdl-ram', `RAM ${formatBytes(e.rss_bytes)}`));
        for (const g of e.gpus) {
          const util = g.util_percent === null ? '–' : `${g.util_percent.toFixed(0)}%`;
          load.appendChild(
            el('span', 'pdl-gpu', `GPU ${g.index} ${util} · ${formatBytes(g.mem_used_bytes)} / ${formatBytes(g.mem_total_bytes)}`)
          );
        }
      } else {
        load.appendChild(el('span', 'pdl-remote', e.pid !== null ? 'on another host' : 'asking the engine…'));
      }
    } else if (e.state === 'dead') {
      load.appendChild(el('span', 'pdl-dead-note', 'process gone; restarting on its slot'));
    } else {
      load.appendChild(el('span', 'pdl-starting-note', 'waiting for the engine to register'));
    }
    card.appendChild(load);
    return card;
  }

  private renderCell(model: ICluster): void {
    this._cell.replaceChildren();
    const cell = model.cell;
    if (!cell || !cell.ranks.length) {
      return;
    }
    const state = cell.running ? 'running' : 'finished';
    const title = el('h3', 'pdl-cell-title', `Cell ${cell.number}: ${state} on ${cell.ranks.length} rank(s)`);
    this._cell.dataset.running = String(cell.running);
    this._cell.appendChild(title);
    for (const r of cell.ranks) {
      const row = el('div', 'pdl-rank');
      row.dataset.rank = String(r.rank);
      if (r.step !== null && r.step !== undefined) {
        row.dataset.step = String(r.step);
      }
      row.appendChild(el('span', 'pdl-rank-name', `rank ${r.rank}`));
      const bar = el('div', 'pdl-bar');
      const fill = el('div', 'pdl-bar-fill');
      const fraction = r.total && r.step ? Math.min(1, r.step / r.total) : 0;
      fill.style.width = `${(100 * fraction).toFixed(1)}%`;
      bar.appendChild(fill);
      row.appendChild(bar);
      row.appendChild(el('span', 'pdl-rank-text', progressText(r)));
      this._cell.appendChild(row);
    }
  }

  protected onAfterShow(): void {
    this.schedule(0);
  }

  protected onAfterHide(): void {
    this.cancel();
  }

  protected onBeforeDetach(): void {
    this.cancel();
  }

  dispose(): void {
    this.cancel();
    super.dispose();
  }

  private schedule(delay: number): void {
    this.cancel();
    this._timer = window.setTimeout(async () => {
      await this.refresh();
      if (this.isVisible && !this.isDisposed) {
        this.schedule(this._refreshMs);
      }
    }, delay);
  }

  private cancel(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _model: ICluster | null = null;
  private _refreshMs = DEFAULT_REFRESH_MS;
  private _timer: number | null = null;
  private _stopButton: HTMLButtonElement;
  private _restartButton: HTMLButtonElement;
  private _summary: HTMLElement;
  private _notice: HTMLElement;
  private _engines: HTMLElement;
  private _cell: HTMLElement;
}
