"""CPU, memory and GPU use of engine processes on this host.

:class:`ProcessSampler` measures a process together with its children (DataLoader
workers): CPU in percent of one core (200 = two cores busy) since the previous
sample of the same process, and resident memory in bytes. :func:`gpu_stats` asks
``nvidia-smi`` once per call for every GPU; an engine's GPUs are those named by its
``CUDA_VISIBLE_DEVICES`` (indices or UUIDs).
"""

from __future__ import annotations

import psutil

from pdl.nvidia_smi import query_gpus

#: nvidia-smi fields, in the order of its CSV output.
GPU_FIELDS = ("index", "uuid", "name", "utilization.gpu", "memory.used", "memory.total")
_MIB = 1024 * 1024


class ProcessSampler:
    """Per-process CPU% and RSS; keeps the psutil objects CPU% is measured against."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def _cpu(self, proc: psutil.Process) -> float | None:
        """CPU% of ``proc`` since its last call; None on the first (nothing to compare)."""
        known = self._procs.get(proc.pid)
        if known is None or known.create_time() != proc.create_time():
            self._procs[proc.pid] = proc
            proc.cpu_percent(None)
            return None
        return known.cpu_percent(None)

    def sample(self, pid: int) -> dict | None:
        """``{"cpu_percent", "rss_bytes"}`` for ``pid`` and its children, or None if
        the process is gone. ``cpu_percent`` is None on the first sample of ``pid``."""
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(pid, None)
            return None
        cpu: float | None = 0.0
        rss = 0
        for proc in family:
            try:
                used = self._cpu(proc)
                rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if proc is root and used is None:
                cpu = None
            elif cpu is not None:
                cpu += used or 0.0
        return {"cpu_percent": None if cpu is None else round(cpu, 1), "rss_bytes": rss}

    def forget_except(self, pids: set[int]) -> None:
        """Drop what is kept about processes other than ``pids`` and their children."""
        keep = set(pids)
        for pid in pids:
            try:
                keep.update(c.pid for c in psutil.Process(pid).children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        for pid in set(self._procs) - keep:
            del self._procs[pid]


def gpu_stats(nvidia_smi: str | None = None, timeout_s: float = 5.0) -> list[dict]:
    """Every GPU nvidia-smi lists: ``{"index", "uuid", "name", "util_percent",
    "mem_used_bytes", "mem_total_bytes"}``; [] without nvidia-smi or when it fails."""
    return [{
        "index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"],
        "util_percent": _number(gpu["utilization.gpu"]),
        "mem_used_bytes": _mib(gpu["memory.used"]), "mem_total_bytes": _mib(gpu["memory.total"]),
    } for gpu in query_gpus(GPU_FIELDS, nvidia_smi=nvidia_smi, timeout_s=timeout_s)]


def gpus_of(cuda_visible: str | None, gpus: list[dict]) -> list[dict]:
    """The GPUs an engine sees, from its ``CUDA_VISIBLE_DEVICES`` (None or "": none)."""
    if not cuda_visible:
        return []
    wanted = [v.strip() for v in cuda_visible.split(",") if v.strip()]
    return [g for w in wanted for g in gpus if w in (g["index"], g["uuid"])]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _mib(text: str) -> int | None:
    value = _number(text)
    return None if value is None else int(value * _MIB)
