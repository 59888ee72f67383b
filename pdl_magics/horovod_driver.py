"""The driver side of ``--backend horovod``: Horovod's rendezvous, run by the kernel.

This is what ``horovodrun --gloo``, horovod.ray and horovod.spark do, without
ssh or new processes: the notebook kernel runs Horovod's gloo rendezvous server
(:class:`horovod.runner.http.http_server.RendezvousHTTPServer`), and each
engine, already running, gets the ``HOROVOD_*`` environment of its rank before
it calls ``hvd.init()`` (see :func:`pdl.runtime.engine.init_horovod`).

Horovod is optional. :func:`require` raises a one-line
:class:`~pdl_magics.errors.DistributedUsageError` saying how to install it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pdl_server.world import local_ranks

from .errors import DistributedUsageError

#: Seconds Horovod's background thread may wait on a peer's background thread
#: (rendezvous, or a transfer of a collective that every rank has entered).
#: Horovod's own default. User code never runs into it: ranks waiting for a
#: slow peer wait in Python, bounded by the stall timeout (``--timeout``).
GLOO_TIMEOUT_S = 30

#: What to run to get Horovod (it has no wheel on PyPI; see docs/admin.md).
INSTALL_HINT = "run scripts/setup --horovod (builds horovod 0.28.1 once per machine, ~5 min)"


def require() -> None:
    """Raise DistributedUsageError (one line) unless Horovod's runner can be imported here."""
    try:
        import horovod.runner.common.util.hosts  # noqa: F401
        import horovod.runner.http.http_server  # noqa: F401
    except ImportError as e:
        raise DistributedUsageError(
            f"--backend horovod needs Horovod, which is not installed ({e}); {INSTALL_HINT}"
        ) from None


@dataclass(frozen=True)
class Slot:
    """Where one rank sits in Horovod's view of the world (horovod's ``SlotInfo``)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def plan(hosts: Sequence[str]) -> list[Slot]:
    """Horovod's slot plan for ranks ``0..len(hosts)-1`` whose hosts are ``hosts``.

    Ranks on one host must be contiguous (PDL orders ranks by host, then slot).
    ``local_*`` count the ranks on the same host; ``cross_*`` count the hosts
    that have a rank with the same local rank, as ``horovodrun`` computes them.
    """
    for i, host in enumerate(hosts):
        if i and host != hosts[i - 1] and host in hosts[:i]:
            raise ValueError(f"ranks of host {host!r} are not contiguous: {list(hosts)}")
    local_rank = local_ranks(hosts)
    per_host = Counter(hosts)
    cross_rank, cross_size = [], {}
    for lr in local_rank:
        cross_rank.append(cross_size.get(lr, 0))
        cross_size[lr] = cross_rank[-1] + 1
    return [
        Slot(host, rank, lr, cr, len(hosts), per_host[host], cross_size[lr])
        for rank, (host, lr, cr) in enumerate(zip(hosts, local_rank, cross_rank))
    ]


def rank_env(slot: Slot, rendezvous_addr: str, rendezvous_port: int, timeout_s: float) -> dict[str, str]:
    """The ``HOROVOD_*`` environment that makes ``hvd.init()`` join as ``slot``.

    Gloo runs the controller and the CPU collectives. GPU collectives use
    whatever the installed Horovod was built with (NCCL with
    ``HOROVOD_GPU_OPERATIONS=NCCL`` at build time); nothing is set for them here.
    ``HOROVOD_GLOO_IFACE`` is chosen by the engine (the NIC of its address).
    A collective that some ranks wait in for more than ``timeout_s`` seconds
    (a stall, in Horovod's words) shuts the world down with an error.
    """
    timeout = max(1, round(timeout_s))
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S),
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(min(60, timeout)),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(timeout),
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


class Rendezvous:
    """Horovod's gloo rendezvous server for one group, on a thread of this process.

    ``bind_addr`` is where it listens: 127.0.0.1 when every rank runs on this
    machine, else the address the engines reach this machine at. One server
    serves one group formation; :meth:`stop` it when the group is replaced.
    """

    def __init__(self, slots: list[Slot], bind_addr: str):
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self.addr = bind_addr
        self._httpd = RendezvousHTTPServer((bind_addr, 0), RendezvousHandler, False)
        self._httpd.daemon_threads = True
        self._httpd.init([SlotInfo(**vars(s)) for s in slots])
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
            name="pdl-horovod-rendezvous", daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
            self._httpd.server_close()
