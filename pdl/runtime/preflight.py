"""Preflight, engine side: what this rank runs on, and an all-reduce smoke test.

The notebook (:mod:`pdl_magics.preflight`) calls these through
:func:`pdl.runtime.engine.preflight` on every rank and compares the answers. Both
return plain data (dicts of str, int, float, bool, None, lists) and never raise
for what they find: a missing interface or a failed all-reduce is data.

Versions are read from the modules this process has imported (their
``__version__``), not from the files installed on disk, so a module swapped in
the running process is reported as what it is.
"""

from __future__ import annotations

import datetime
import os
import time

from pdl.engine_contract import EngineContract
from pdl.nvidia_smi import query_gpus
from pdl.runtime.identity import describe
from pdl.netaddr import iface_for

#: Seconds ``nvidia-smi`` may take before the driver version is reported as unknown.
NVIDIA_SMI_TIMEOUT_S = 10


def probe() -> dict:
    """What this rank runs on.

    Returns ``{"host", "pid", "slot", "reserved_gpu", "gpus_seen": [{"name", "uuid"}],
    "host_gpus": {index: uuid} (from nvidia-smi, {} without it), "driver", "cuda",
    "nccl", "torch", "horovod", "iface": {"name", "source", "missing": [...],
    "down": [...]}}``. ``reserved_gpu`` is ``$PDL_GPU`` (Swarm) or
    ``$CUDA_VISIBLE_DEVICES``: "" reserves none, None means unknown (not set).
    Version fields are None where the component is absent (no driver, a CPU
    build of torch, Horovod not installed).
    """
    me = describe()
    gpus = _torch_gpus()
    driver, host_gpus = _nvidia_smi()
    reserved = EngineContract.from_env().gpu
    if reserved is None:
        reserved = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {
        "host": me["host"],
        "pid": me["pid"],
        "slot": me["slot"],
        "reserved_gpu": reserved,
        **gpus,
        "host_gpus": host_gpus,
        "driver": driver,
        "horovod": _horovod_version(),
        "iface": collective_iface(bool(gpus["gpus_seen"]), me["addr"]),
    }


def _torch_gpus() -> dict:
    """torch's version, its CUDA and NCCL versions and the GPUs it sees."""
    import torch

    seen, nccl = [], None
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            seen.append({"name": props.name, "uuid": f"GPU-{uuid}" if uuid is not None else None})
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # noqa: BLE001 - a torch built without NCCL
            nccl = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "gpus_seen": seen}


def _nvidia_smi() -> tuple[str | None, dict[int, str]]:
    """(driver version, {GPU index: UUID}) of this host, from ``nvidia-smi`` (None, {} without it)."""
    gpus = [g for g in query_gpus(("index", "uuid", "driver_version"), timeout_s=NVIDIA_SMI_TIMEOUT_S)
            if g["index"].isdigit()]
    return (gpus[0]["driver_version"] if gpus else None), {int(g["index"]): g["uuid"] for g in gpus}


def _horovod_version() -> str | None:
    """The version of the ``horovod`` module this process imports (None if it cannot).

    The module's ``__version__`` is what counts; when it is the installed
    distribution's version, that one is reported, as it also carries the local
    build label (``0.28.1+pdl1``).
    """
    try:
        import horovod
    except ImportError:
        return None
    version = getattr(horovod, "__version__", None)
    if version is None:
        return None
    try:
        from importlib.metadata import version as installed

        dist = installed("horovod")
    except Exception:  # noqa: BLE001 - no metadata (a source tree on sys.path)
        return str(version)
    return dist if dist.partition("+")[0] == str(version) else str(version)


def collective_iface(cuda: bool, addr: str) -> dict:
    """The network interface this rank's collectives use, and whether it works.

    ``$NCCL_SOCKET_IFNAME`` on a rank that sees a GPU, ``$GLOO_SOCKET_IFNAME``
    on one that does not, when set; else the interface holding ``addr`` (the
    engine's address). Returns ``{"name", "source", "missing": [names that do
    not exist], "down": [names that exist but are down]}``.
    """
    import psutil

    stats = psutil.net_if_stats()
    var = "NCCL_SOCKET_IFNAME" if cuda else "GLOO_SOCKET_IFNAME"
    spec = os.environ.get(var, "").strip()
    if not spec:
        source = f"address {addr}"
        try:
            name = iface_for(addr)
        except RuntimeError:
            return {"name": "?", "source": source, "missing": [f"(none holds {addr})"], "down": []}
        return {"name": name, "source": source, "missing": [] if name in stats else [name],
                "down": [name] if name in stats and not stats[name].isup else []}
    if cuda and not spec.startswith("="):
        # NCCL prefixes or exclusions: NCCL picks among the matches, one that is up will do
        names = _nccl_matches(spec, stats)
        up = [n for n in names if stats[n].isup]
        return {"name": spec, "source": var, "missing": [] if names else [spec], "down": [] if up else names}
    names = [n.strip() for n in spec.lstrip("=").split(",") if n.strip()]  # each one is used
    return {"name": spec, "source": var, "missing": [n for n in names if n not in stats],
            "down": [n for n in names if n in stats and not stats[n].isup]}


def _nccl_matches(spec: str, stats) -> list[str]:
    """This host's interfaces that an NCCL_SOCKET_IFNAME of prefixes (``eth,ib``) or
    exclusions (``^docker,lo``, ``^=docker0``) selects."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    patterns = [p.strip() for p in (body[1:] if exact else body).split(",") if p.strip()]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return sorted(n for n in stats if hit(n) != exclude)


def all_reduce_smoke(backend: str, nbytes: int, iters: int, timeout_s: float) -> dict:
    """Sum ``nbytes`` of float32 over this engine's group ``iters`` times (after one warm-up).

    Every rank contributes ``rank + 1``, so each element must come back as
    ``n(n+1)/2``. ``backend`` is "torch" (the torch.distributed group) or
    "horovod". No step waits longer than ``timeout_s`` in total. Returns
    ``{"seconds": mean per all-reduce, "busbw_gbs": 2(n-1)/n * nbytes / seconds / 1e9
    (None for n = 1), "value", "expected", "error": None or one line}``.
    """
    deadline = time.monotonic() + timeout_s
    try:
        reduce, rank, size, device = _reducer(backend, deadline)
        import torch

        t = torch.empty(max(1, nbytes // 4), dtype=torch.float32, device=device)
        expected = size * (size + 1) / 2
        t.fill_(rank + 1)
        reduce(t, "warmup")
        started = time.perf_counter()
        for i in range(iters):
            t.fill_(rank + 1)
            reduce(t, str(i))
        seconds = (time.perf_counter() - started) / max(1, iters)
        low, high = t.min().item(), t.max().item()
    except TimeoutError:
        return {"error": f"all-reduce did not finish within {timeout_s:g} s"}
    except Exception as e:  # noqa: BLE001 - a failed collective is a finding, not a crash
        text = str(e).strip().splitlines()
        return {"error": f"all-reduce failed: {type(e).__name__}: {text[0] if text else ''}".rstrip(": ")}
    value = low if low != expected else high
    busbw = 2 * (size - 1) / size * t.numel() * 4 / seconds / 1e9 if size > 1 and seconds > 0 else None
    return {"seconds": seconds, "busbw_gbs": busbw, "value": value, "expected": expected, "error": None}


def _reducer(backend: str, deadline: float):
    """(reduce(tensor, tag), rank, world size, device) for the group of ``backend``."""
    import torch

    if backend == "horovod":
        import horovod.torch as hvd

        device = "cuda" if torch.cuda.is_available() and hvd.nccl_built() else "cpu"

        def reduce(t, tag):
            handle = hvd.allreduce_async_(t, op=hvd.Sum, name=f"pdl.preflight.{tag}")
            while not hvd.poll(handle):
                if time.monotonic() > deadline:
                    raise TimeoutError
                time.sleep(0.0002)
            hvd.synchronize(handle)

        return reduce, hvd.rank(), hvd.size(), device
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("this engine is in no torch.distributed group")
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"

    def reduce(t, tag):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        work = dist.all_reduce(t, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=left))
        except RuntimeError as e:
            if time.monotonic() >= deadline or "timed out" in str(e).lower():
                raise TimeoutError from None
            raise

    return reduce, dist.get_rank(), dist.get_world_size(), device


__all__ = ["all_reduce_smoke", "collective_iface", "probe"]
