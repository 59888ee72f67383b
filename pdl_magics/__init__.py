"""PDL notebook magics: ``%load_ext pdl_magics`` then ``%%distributed -n N``.

Without IPython, use :func:`run` (or :class:`DistributedSession`) directly.
"""

from .errors import DistributedUsageError, RankFailed, RanksStuck
from .session import BACKENDS, CellResult, DistributedSession

__all__ = [
    "BACKENDS",
    "CellResult",
    "DistributedSession",
    "DistributedUsageError",
    "RankFailed",
    "RanksStuck",
    "load_ipython_extension",
    "run",
]


def run(code: str, n: int | None = None, **kwargs) -> CellResult:
    """Run ``code`` on ``n`` ranks of the default session, as ``%%distributed -n n`` does."""
    return DistributedSession.default().run(code, n, **kwargs)


def load_ipython_extension(ipython):
    from .magics import DistributedMagics

    ipython.register_magics(DistributedMagics(ipython))
