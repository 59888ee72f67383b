"""How long a user's server keeps its workers: the end of its session, the warning
before it, and the release just before it, so that no cell starts on engines about to
be killed.

Where the cluster's scheduler limits the workers, the end is its limit, as the kind's
engine host reads it (Slurm: the time limit of the job that holds the GPUs, which an
extension moves). Under the hub's own session limit, where the admin set one: the hub tells the end at the spawn (``PDL_SESSION_ENDS_AT``) and in each grant
of workers again (:attr:`pdl.lease.Grant.ends_at`), and takes the workers back itself
shortly after it (:mod:`pdl_spawner.core.session_limit`) should the server not release them.
The supervisor (:mod:`pdl_server.singleuser`) releases the engines
:data:`END_MARGIN_S` seconds before it, as an idle release does, with a reason that
says why; the kernel (:mod:`pdl_magics.engines`) waits for that release instead of
sending a cell in the last seconds, and the next cell asks for workers again. The
Cluster panel (:mod:`pdl_lab.monitor`) shows the time left and the warning, and every
``%%distributed`` cell warns in one line once less than the warning time is left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pdl.contract import ServerContract
from pdl.lease import Extended, LeaseFiles
from pdl.limits import duration, session_limit_why
from pdl_server.engine_hosts import host_class

#: Seconds before the end that the engines are released (and cells wait for that).
END_MARGIN_S = 5.0
#: Seconds before the end from which the user is warned, unless the hub says otherwise
#: (``PDL_SESSION_WARN_S``).
WARN_BEFORE_S = 600.0


@dataclass(frozen=True)
class SessionEnd:
    """The end of a server's session: ``ends_at`` (epoch seconds), ``why`` (what ends it,
    e.g. "Slurm job 42's time limit"), and the warning time (seconds before it)."""

    ends_at: float
    why: str
    warn_before_s: float = WARN_BEFORE_S

    def left_s(self, now: float | None = None) -> float:
        """Seconds left (0 once it has ended)."""
        return max(0.0, self.ends_at - (time.time() if now is None else now))

    def ending(self, now: float | None = None) -> bool:
        """True from :data:`END_MARGIN_S` before the end: the engines are released then."""
        return self.left_s(now) <= END_MARGIN_S

    def warning(self, now: float | None = None) -> str | None:
        """One line while less than the warning time is left (None before, and once ended)."""
        left = self.left_s(now)
        if not 0 < left <= self.warn_before_s:
            return None
        return f"Your session ends in {duration(left)} ({self.why}): save your work, or extend it."

    def ended_reason(self) -> str:
        """The release's reason at the end (one line, as the next cell shows it)."""
        return f"{self.why} reached at {time.strftime('%H:%M UTC', time.gmtime(self.ends_at))}"


def forget_readings() -> None:
    """Read the scheduler's end afresh (the hub just moved it): the kind's host forgets
    what it read in this process."""
    contract = ServerContract.from_env()
    if contract.kind:
        host_class(contract.kind).forget_readings()


def session_end(contract: ServerContract | None = None, lease: LeaseFiles | None = None, *,
                fresh: bool = False) -> SessionEnd | None:
    """This server's session end, or None without one. Under a hub's session limit: the
    end of the grant the engines came back on, else the spawn's, as the hub extended it
    (:class:`pdl.lease.Extended`). Otherwise the scheduler's own end, as the kind's
    engine host reads it (:meth:`pdl_server.engine_hosts.EngineHost.scheduler_end`;
    Slurm: the time limit of the job holding the workers; ``fresh``: read now)."""
    contract = contract or ServerContract.from_env()
    lease = lease if lease is not None else LeaseFiles.of_this_server()
    held = lease.held() if lease is not None else None
    warn_before_s = contract.session_warn_s or WARN_BEFORE_S
    if contract.session_limit_s:
        ends_at = held.ends_at if held is not None and held.ends_at else contract.session_ends_at
        extension = lease.extension() if lease is not None else None
        if isinstance(extension, Extended) and ends_at and abs(extension.of - ends_at) < 0.01:  # this session's only
            ends_at = max(ends_at, extension.ends_at)
        return SessionEnd(ends_at=ends_at, why=session_limit_why(contract.session_limit_s),
                          warn_before_s=warn_before_s) if ends_at else None
    scheduler_end = host_class(contract.kind).scheduler_end(contract, held, fresh=fresh) if contract.kind else None
    if scheduler_end is None:
        return None
    ends_at, why = scheduler_end
    return SessionEnd(ends_at=ends_at, why=why, warn_before_s=warn_before_s)
