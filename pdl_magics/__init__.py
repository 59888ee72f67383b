"""PDL notebook magics: ``%load_ext pdl_magics`` then ``%%distributed -n N`` (and ``%pdl check``).

Without IPython, use :func:`run` and :func:`check` (or :class:`DistributedSession`) directly.
"""

from .errors import DistributedUsageError, RankFailed, RanksStuck
from .preflight import PreflightFailed, PreflightReport
from .session import BACKENDS, DistributedSession
from .world import CellResult

__all__ = [
    "BACKENDS",
    "CellResult",
    "DistributedSession",
    "DistributedUsageError",
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
