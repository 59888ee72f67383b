"""What the Cluster panel shows and does: engines, their load, the running cell.

:class:`ClusterMonitor` holds one ipyparallel client on the user's cluster:

- **hub**: the cluster ``pdl-singleuser`` runs (``$PDL_CLUSTER_FILE``), whose slots
  are ``$PDL_SLOTS`` (or those its engines came back on after an idle release; none
  while they are released: :mod:`pdl.lease`);
- **local**: the cluster of the newest live kernel that wrote a status file
  (:mod:`pdl_server.status_file`); none before its first ``%%distributed`` cell.

An engine is *busy* while the controller has a task queued for it, *dead* once its
process is gone (or it has unregistered and no engine replaced it on its slot).
Who an engine is (pid, host, slot, GPUs) comes from ``pdl.runtime.identity.describe()``,
asked once per engine while it is idle. CPU, memory and GPU use are measured for
engines on this host. The running cell's per-rank progress comes from the kernel's
status file.

Every method that touches the client runs on one worker thread (ipyparallel's sync
calls block); the ``async`` methods are what the HTTP handlers await.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ipyparallel as ipp

from pdl.contract import ServerContract
from pdl.lease import Extended, Refusal, Release
from pdl.limits import duration, holding_line
from pdl_server import clusters
from pdl_server.lease_owner import this_servers_owner
from pdl_server.session_clock import session_end
from pdl_server.status_file import pid_alive, read_status
from pdl_server.world import call_engine, rank_order

from .resources import ProcessSampler, gpu_stats, gpus_of

#: Seconds between attempts to connect to a cluster that is not up yet.
RETRY_S = 3.0
#: Seconds Stop gives the kernel to interrupt its ranks before signalling them itself.
KERNEL_GRACE_S = 3.0
#: Seconds an nvidia-smi reading is reused.
GPU_CACHE_S = 0.8


def _controller_ready(cluster_file: str) -> bool:
    """True once the cluster file and its controller's client connection file exist."""
    try:
        data = json.loads(Path(cluster_file).read_text())
    except (OSError, ValueError):
        return False
    cluster = data.get("cluster", {})
    security = Path(cluster.get("profile_dir", "")) / "security"
    cid = cluster.get("cluster_id", "")
    name = f"ipcontroller-{cid}-client.json" if cid else "ipcontroller-client.json"
    return (security / name).exists()


class ClusterMonitor:
    """One user's cluster, seen from their Jupyter server."""

    def __init__(self, hub_cluster_file: str | None = None, hub_slots: list[str] | None = None,
                 nvidia_smi: str | None = None):
        self.hub_cluster_file = hub_cluster_file if hub_cluster_file is not None else clusters.hub_cluster_file()
        self._fixed_slots = hub_slots
        self.lease = this_servers_owner() if self.hub_cluster_file else None
        self.nvidia_smi = nvidia_smi
        self.hostname = socket.gethostname()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdl-monitor")
        self._client: ipp.Client | None = None
        self._client_file: str | None = None
        self._retry_at = 0.0
        self._error: str | None = None
        self._info: dict[int, dict] = {}      # engine id -> describe()
        self._pending: dict[int, object] = {}  # engine id -> AsyncResult of describe
        self._gone: dict[str, dict] = {}       # slot -> describe() of its engine that died
        self._sampler = ProcessSampler()
        self._gpus: tuple[float, list] = (0.0, [])

    @property
    def hub_slots(self) -> list[str]:
        """The slots reserved for this server now: none while its engines are released."""
        if not self.hub_cluster_file or self.released() is not None:
            return []
        return list(self._fixed_slots) if self._fixed_slots is not None else clusters.hub_slots()

    def released(self) -> Release | None:
        """The hub server's release of its engines, or None while it holds them."""
        return self.lease.view().released if self.lease is not None else None

    # -- the async API the handlers use ---------------------------------------

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def snapshot(self) -> dict:
        return await self._run(self.snapshot_sync)

    async def stop_cell(self) -> dict:
        """Interrupt the running distributed cell on every rank.

        The kernel running it gets SIGINT, so its session interrupts every rank
        (``client.send_signal``) and rebuilds the process group for the next cell.
        Engines still busy after :data:`KERNEL_GRACE_S` (or when no kernel reports a
        running cell) get SIGINT from here, through ipyparallel's ``send_signal``.
        """
        first = await self._run(self._signal_kernel)
        if first["kernel_pid"] is not None:
            deadline = time.monotonic() + KERNEL_GRACE_S
            while time.monotonic() < deadline and await self._run(self._busy, first["targets"]):
                await asyncio.sleep(0.2)
        engines = await self._run(self._signal_engines, first["targets"])
        return {"kernel_pid": first["kernel_pid"], "signalled_engines": engines}

    async def restart_engines(self) -> dict:
        return await self._run(self._restart_engines)

    def close(self) -> None:
        """Disconnect from the cluster (at server exit)."""
        try:
            self._pool.submit(self._disconnect).result(timeout=10)
        except Exception:  # noqa: BLE001 - the pool is already shut down at interpreter exit
            self._disconnect()
        self._pool.shutdown(wait=False)

    # -- connection -------------------------------------------------------------

    def _target(self) -> tuple[str, str | None, dict | None]:
        """(mode, cluster file, live status) for the cluster to show."""
        if self.hub_cluster_file:
            return "hub", self.hub_cluster_file, read_status(self.hub_cluster_file)
        status = read_status()
        if status and status.get("cluster_file"):
            return "local", status["cluster_file"], status
        return "none", None, None

    def _connect(self, cluster_file: str | None) -> ipp.Client | None:
        if self._client is not None and self._client_file == cluster_file:
            return self._client
        if self._client is not None:
            self._disconnect()
        if cluster_file is None or time.monotonic() < self._retry_at:
            return None
        if not _controller_ready(cluster_file):
            self._error = "the cluster is starting"
            self._retry_at = time.monotonic() + 1.0
            return None
        try:
            client = ipp.Cluster.from_file(cluster_file).connect_client_sync()
        except Exception as e:  # noqa: BLE001 - shown in the panel, retried
            self._error = f"cannot connect to the cluster: {type(e).__name__}: {e}"
            self._retry_at = time.monotonic() + RETRY_S
            return None
        client.block = False
        self._client, self._client_file, self._error = client, cluster_file, None
        return client

    def _disconnect(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
        self._client = self._client_file = None
        self._info.clear()
        self._pending.clear()
        self._gone.clear()

    # -- engines ----------------------------------------------------------------

    def _queues(self, client) -> dict[int, int]:
        """Engine id -> tasks outstanding (running or waiting), not counting our describe."""
        try:
            status = client.queue_status()
        except Exception:  # noqa: BLE001 - a controller that went away: reconnect next time
            self._disconnect()
            return {}
        return {
            eid: max(0, q.get("queue", 0) - (1 if eid in self._pending else 0))
            for eid, q in status.items() if isinstance(eid, int)
        }

    def _update_info(self, client, ids: list[int], queues: dict[int, int]) -> None:
        for eid, ar in list(self._pending.items()):
            if ar.ready():
                del self._pending[eid]
                try:
                    self._info[eid] = ar.get(0)
                except Exception:  # noqa: BLE001 - an engine that died while answering
                    pass
        for eid in ids:
            if eid not in self._info and eid not in self._pending and queues.get(eid, 0) == 0:
                try:
                    self._pending[eid] = client[eid].apply_async(call_engine, "describe")
                except Exception:  # noqa: BLE001 - gone since ``ids`` was read (a release): the next read tells
                    continue
        for eid in set(self._info) - set(ids):
            info = self._info.pop(eid)
            self._gone[info["slot"]] = {**info, "id": eid}
        for eid in set(self._pending) - set(ids):
            del self._pending[eid]

    def _is_local(self, info: dict | None) -> bool:
        return bool(info) and info.get("host") == self.hostname

    def _alive(self, info: dict | None) -> bool:
        return not self._is_local(info) or pid_alive(info["pid"])

    def _gpu_list(self) -> list[dict]:
        at, gpus = self._gpus
        if time.monotonic() - at > GPU_CACHE_S:
            self._gpus = (time.monotonic(), gpu_stats(self.nvidia_smi))
        return self._gpus[1]

    def _row(self, eid: int | None, info: dict | None, state: str, rank_of: dict) -> dict:
        info = info or {}
        row = {
            "id": eid, "slot": info.get("slot", ""), "host": info.get("host"), "pid": info.get("pid"),
            "state": state, "rank": rank_of.get(eid), "local": self._is_local(info),
            "cuda_visible": info.get("cuda_visible"),
            "cpu_percent": None, "rss_bytes": None, "gpus": [],
        }
        if state in ("idle", "busy") and row["local"]:
            usage = self._sampler.sample(info["pid"])
            if usage:
                row.update(usage)
            if info.get("cuda_visible"):
                row["gpus"] = gpus_of(info["cuda_visible"], self._gpu_list())
        return row

    def _engine_rows(self, client, status: dict | None) -> list[dict]:
        ids = sorted(client.ids)
        queues = self._queues(client)
        if self._client is None:  # lost the controller
            return []
        self._update_info(client, ids, queues)
        rank_of = {r["engine_id"]: r["rank"] for r in (status or {}).get("world", [])}
        rows = []
        for eid in ids:
            info = self._info.get(eid)
            if not self._alive(info):
                state = "dead"
            else:
                state = "busy" if queues.get(eid, 0) > 0 else "idle"
            rows.append(self._row(eid, info, state, rank_of))
        live_slots = {r["slot"] for r in rows if r["state"] != "dead" and r["slot"]}
        for slot in list(self._gone):
            if slot in live_slots:
                del self._gone[slot]
            else:
                gone = self._gone[slot]
                rows.append(self._row(gone["id"], gone, "dead", rank_of))
        seen = {r["slot"] for r in rows}
        undescribed = sum(1 for r in rows if not r["slot"])  # registered, slot not yet known
        for slot in [s for s in self.hub_slots if s not in seen][undescribed:]:
            rows.append(self._row(None, {"slot": slot}, "starting", rank_of))
        self._sampler.forget_except({r["pid"] for r in rows if r["pid"] and r["state"] != "dead"})
        rows.sort(key=lambda r: rank_order(r["host"], r["slot"], r["id"] if r["id"] is not None else -1))
        return rows

    @staticmethod
    def _cell(status: dict | None) -> dict | None:
        if not status:
            return None
        metrics = status.get("metrics") or {}
        ranks = []
        for r in status.get("world", []):
            snap = metrics.get(str(r["rank"])) or {}
            ranks.append({
                "rank": r["rank"], "engine_id": r["engine_id"], "host": r.get("host"), "slot": r.get("slot"),
                "step": snap.get("step"), "total": snap.get("total"), "values": snap.get("values") or {},
                "time": snap.get("time"), "history": snap.get("history") or [],
            })
        return {
            "number": status.get("cell"), "running": bool(status.get("running")),
            "kernel_pid": status.get("pid"), "started": status.get("started"),
            "updated": status.get("updated"), "ranks": ranks,
        }

    def session(self) -> dict | None:
        """The session's end (:mod:`pdl_server.session_clock`): ``{"ends_at" (epoch s),
        "left_s", "why", "text" ("Time left: 9 min (why)"), "warning" (one line, or None),
        "extendable" (the hub lets the user ask for more time), "extension" (one line on
        the last wish for more time, or None)}``, or None without one."""
        end = session_end(lease=self.lease.files if self.lease is not None else None)
        if end is None:
            return None
        left = end.left_s()
        contract = ServerContract.from_env()
        return {"ends_at": end.ends_at, "left_s": left, "why": end.why,
                "text": f"Time left: {duration(left)} ({end.why})", "warning": end.warning(),
                "extendable": contract.session_extendable,
                "extension": self.extension_line(end.ends_at)}

    def gpu_idle_line(self) -> str | None:
        """The hub's flag on GPUs held idle, in one line (:meth:`pdl.lease.GpuIdle.line`); None without one."""
        flag = self.lease.view().gpu_idle if self.lease is not None else None
        return flag.line() if flag is not None else None

    def extension_line(self, ends_at: float) -> str | None:
        """Where the last wish for more time stands, in one line (an extension: the
        session's end now, ``ends_at``); None without one."""
        if self.lease is None:
            return None
        view = self.lease.view()
        if view.extend is not None:
            return "Asking the hub for more time..."
        answer = view.extension
        if isinstance(answer, Extended):
            return f"Extended: your session now ends at {time.strftime('%H:%M UTC', time.gmtime(ends_at))}."
        if isinstance(answer, Refusal):
            return answer.reason
        return None

    def ask_extension(self) -> dict:
        """The user's wish for more time, recorded for the hub (Extend in the panel);
        ``{"ok": bool, "message": one line}``."""
        session = self.session()
        if session is None or not session["extendable"] or self.lease is None:
            return {"ok": False, "message": "This session cannot be extended here."}
        self.lease.wish_extension()
        return {"ok": True, "message": "Asking the hub for more time..."}

    def limits_line(self, holding: bool) -> str | None:
        """The user's limit and what this server holds (:func:`pdl.limits.holding_line`;
        none while its engines are released), from what the hub told the server; None
        when it told none."""
        contract = ServerContract.from_env()
        if not contract.workers_limit:
            return None
        held = clusters.hub_workers() if holding else 0
        return holding_line(contract.workers_limit, held, contract.limits_note)

    def snapshot_sync(self) -> dict:
        """The panel's model (see docs/cluster-panel.md for the fields)."""
        mode, cluster_file, status = self._target()
        client = self._connect(cluster_file)
        rows = self._engine_rows(client, status) if client is not None else []
        released = self.released() if mode == "hub" else None
        if released is not None:  # stopped, or being stopped, on purpose: not dead, none to show
            self._gone.clear()
            rows = []
        slots = self.hub_slots if mode == "hub" else []
        if not slots and released is None:
            slots = list((status or {}).get("slots", []))
        message = None
        if released is not None:
            message = (f"Engines released ({released.reason or 'idle'}): "
                       "the next %%distributed cell asks for them again.")
        elif mode == "none":
            message = "no cluster yet: the first %%distributed cell starts one"
        elif client is None or self._client is None:
            message = self._error or "not connected to the cluster"
        return {
            "mode": mode,
            "connected": self._client is not None,
            "message": message,
            "limits": self.limits_line(released is None) if mode == "hub" else None,
            "session": self.session() if mode == "hub" else None,
            "gpu_idle": self.gpu_idle_line() if mode == "hub" and released is None else None,
            "gpu_type": ServerContract.from_env().gpu_type or None if mode == "hub" else None,
            "cluster_file": cluster_file,
            "slots": slots,
            "nodes": sorted({r["host"] for r in rows if r["host"]}),
            "engines": rows,
            "cell": self._cell(status),
            "time": time.time(),
        }

    # -- actions ----------------------------------------------------------------

    def _busy(self, targets: list[int] | None) -> list[int]:
        client = self._connect(self._target()[1])
        if client is None:
            return []
        queues = self._queues(client)
        ids = targets if targets else list(queues)
        return [eid for eid in ids if queues.get(eid, 0) > 0]

    def _signal_kernel(self) -> dict:
        """SIGINT to the kernel whose status says it runs a cell; its world's engine ids."""
        _, _, status = self._target()
        targets = [r["engine_id"] for r in (status or {}).get("world", [])]
        pid = None
        if status and status.get("running") and pid_alive(status["pid"]):
            pid = status["pid"]
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pid = None
        return {"kernel_pid": pid, "targets": targets}

    def _signal_engines(self, targets: list[int]) -> list[int]:
        busy = self._busy(targets)
        if busy:
            self._client.send_signal(signal.SIGINT, targets=busy, block=True)
        return busy

    def _restart_engines(self) -> dict:
        """SIGKILL every engine of the cluster on this host; their supervisor restarts them.

        Under the hub ``pdl-singleuser`` starts a fresh engine per slot within
        seconds; a local session starts them again at its next ``%%distributed`` cell.
        Engines on other hosts (Docker Swarm) are left alone and listed as skipped.
        """
        mode, cluster_file, status = self._target()
        client = self._connect(cluster_file)
        if client is None:
            return {"killed": [], "skipped": [], "restarted_by": None, "message": self._error}
        ids = sorted(client.ids)
        self._update_info(client, ids, self._queues(client))
        killed, skipped = [], []
        for eid in ids:
            info = self._info.get(eid)
            if self._is_local(info) and pid_alive(info["pid"]):
                try:
                    os.kill(info["pid"], signal.SIGKILL)
                    killed.append(eid)
                    continue
                except OSError:
                    pass
            skipped.append(eid)
        by = "pdl-singleuser" if mode == "hub" else "the next %%distributed cell"
        return {"killed": killed, "skipped": skipped, "restarted_by": by, "message": None}
