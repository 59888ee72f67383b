"""PDL notebook magics: ``%load_ext pdl_magics`` then ``%%distributed -n N`` (and ``%pdl check``).

Without IPython, use :func:`run` and :func:`check` (or :class:`DistributedSession`) directly.

- :mod:`pdl_magics.magics`: the magics; parse their options and hand off to the session.
- :mod:`pdl_magics.session`: :class:`DistributedSession`, one cell on N workers.
- :mod:`pdl_magics.engines`: the session's engines (connect, count, rank order,
  signals, replacement).
- :mod:`pdl_magics.group`: the process group (torch.distributed or Horovod) of a world.
- :mod:`pdl_magics.horovod_driver`: the Horovod rendezvous the kernel runs.
- :mod:`pdl_magics.cell_watch`: waiting for one cell on every rank (streaming, failures,
  interrupts, the hang watchdog).
- :mod:`pdl_magics.progress`: rank 0's progress bar and loss curve.
- :mod:`pdl_magics.preflight`: checking every rank before the first cell (``%pdl check``).
- :mod:`pdl_magics.scale`: ``%pdl scale``, the step predicted for more nodes and other links.
- :mod:`pdl_magics.errors`: the errors a user sees.

It builds on :mod:`pdl_server` (the engine launcher :mod:`pdl_server.clusters`, the
ranks of :mod:`pdl_server.world`, the panel's :mod:`pdl_server.status_file`) and
:mod:`pdl`.
"""

from pdl_server.world import CellResult

from .errors import DistributedUsageError, EnginesReleased, RankFailed, RanksStuck
from .preflight import PreflightFailed, PreflightReport
from .session import BACKENDS, DistributedSession

__all__ = [
    "BACKENDS",
    "CellResult",
    "DistributedSession",
    "DistributedUsageError",
    "EnginesReleased",
    "PreflightFailed",
    "PreflightReport",
    "RankFailed",
    "RanksStuck",
    "check",
    "load_ipython_extension",
    "run",
]


def run(code: str, n: int | None = None, **kwargs) -> CellResult:
    """Run ``code`` on ``n`` ranks of the default session, as ``%%distributed -n n`` does."""
    return DistributedSession.default().run(code, n, **kwargs)


def check(n: int | None = None, **kwargs) -> PreflightReport:
    """The preflight on ``n`` ranks of the default session, as ``%pdl check -n n`` runs it."""
    return DistributedSession.default().check(n, **kwargs)


def load_ipython_extension(ipython):
    from .magics import DistributedMagics

    ipython.register_magics(DistributedMagics(ipython))
