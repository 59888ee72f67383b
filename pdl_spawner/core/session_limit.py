"""The hub's session limit (the embedded default and Docker Swarm; on Slurm a job's time
limit is the session's): how long one grant of workers lasts, and the hub taking them
back should the user's server not give them up at the end.

A session starts when workers are granted (the spawn's, and each grant again after a
release) and ends ``session_limit_s`` seconds later; its user may ask for more time
(Extend), given in steps of ``session_limit_s`` up to ``session_max_s`` from its start
while nobody waits in the queue (:meth:`SessionLimit.extend_session`). The hub tells
the end to the server (``PDL_SESSION_ENDS_AT`` at the spawn, :attr:`pdl.lease.Grant.ends_at` after),
whose supervisor releases the engines a few seconds before it
(:mod:`pdl_server.session_clock`), as an idle release does: the kernel keeps its state
and the next cell asks for workers again, behind whoever waits in the queue. The server
is the user's, so the hub relies on none of that: from :data:`ENFORCE_AFTER_S` after
the end, a server that still holds its workers has them taken back by the hub
(the :class:`~pdl_spawner.core.worker_source.WorkerSource`'s ``take_back``: the local
source closes the GPUs to the user's processes and ends those that hold one open, the
Swarm source scales the engine services to 0). The end survives a hub restart (in the
core's part of the spawner's state, :meth:`SessionLimit.session_state`).
"""

from __future__ import annotations

import time

from traitlets import Float, HasTraits

from pdl.lease import Extended, ExtendAnswer, Refusal
from pdl.limits import duration, session_limit_why

#: Seconds after a session's end from which the hub takes the workers back itself.
ENFORCE_AFTER_S = 10.0
#: A release this many seconds before a session's end, or later, is the session's end
#: (the server releases :data:`pdl_server.session_clock.END_MARGIN_S` before it).
RELEASE_WINDOW_S = 30.0


class SessionLimit(HasTraits):
    """Mixin of :class:`~pdl_spawner.core.spawner.SpawnerCore`: the session's end, kept
    in the spawner's state, started by each grant of workers (see the module docstring)."""

    session_limit_s = Float(
        0.0, config=True,
        help="""Seconds one grant of workers lasts at most (the embedded default and Docker Swarm;
        on Slurm the job's time limit is the session's); 0: no limit. At the end the engines are
        released as by an idle release: the notebook keeps its state, and the next %%distributed
        cell asks for workers again, behind whoever waits in the queue. Users are warned
        session_warning_s before.""",
    )

    session_max_s = Float(
        0.0, config=True,
        help="""Seconds from a session's start up to which its user may extend it (Extend, in the
        Cluster panel), each time by session_limit_s, and only while nobody waits in the queue;
        0 (or at most session_limit_s): no extension. The embedded default and Docker Swarm.""",
    )

    #: When this server's session ends (epoch seconds); 0: no limit, or no workers held.
    session_ends_at = 0.0
    #: When it ended as granted, before any extension (the server's key to the extension).
    session_granted_end = 0.0

    @property
    def session_limited(self) -> bool:
        """True where the hub's session limit applies: set, and the cluster's scheduler
        does not end grants itself (Slurm: the job's time limit is the session's)."""
        return not self.workers.ends_grants and self.session_limit_s > 0

    def start_session(self, now: float | None = None) -> None:
        """Workers were just granted: their session ends ``session_limit_s`` from now."""
        limited = self.session_limited
        self.session_ends_at = (time.time() if now is None else now) + self.session_limit_s if limited else 0.0
        self.session_granted_end = self.session_ends_at

    def stop_session(self) -> None:
        """The workers were given back: no session runs."""
        self.session_ends_at = self.session_granted_end = 0.0

    @property
    def session_extendable(self) -> bool:
        """True where users may ask for more time: of the scheduler that ends grants
        (the source's ``extend``), or of the hub (:attr:`session_max_s` above the limit)."""
        return self.workers.ends_grants or (self.session_limited and self.session_max_s > self.session_limit_s)

    async def waiting_ahead(self) -> int:
        """How many wait in the queue ahead of this server (the spawner's queue's; 0 without one)."""
        return 0

    async def extend_session(self, now: float | None = None) -> ExtendAnswer:
        """The answer to the user's wish for more time: the session's end moved by
        :attr:`session_limit_s`, up to :attr:`session_max_s` from its start, or a
        refusal in one line (no extension here, the longest session reached, others
        waiting for workers, no session running); the source's own answer where it has one
        (:meth:`~pdl_spawner.core.worker_source.WorkerSource.extend`)."""
        own = await self.workers.extend()
        if own is not None:
            return own
        now = time.time() if now is None else now
        if not self.session_extendable:
            return Refusal(f"Not extended: sessions here last {duration(self.session_limit_s)} and are not extended"
                           if self.session_limit_s > 0 else "Not extended: sessions here have no time limit")
        if not self.session_ends_at or now >= self.session_ends_at:
            return Refusal("Not extended: no session runs (the next cell starts one)")
        latest = self.session_granted_end - self.session_limit_s + self.session_max_s
        if self.session_ends_at >= latest:
            return Refusal(f"Not extended: the longest session here is {duration(self.session_max_s)}, and yours "
                           f"has reached it")
        waiting = await self.waiting_ahead()
        if waiting:
            return Refusal(f"Not extended: {waiting} other user{'s are' if waiting > 1 else ' is'} waiting for "
                           f"workers")
        self.session_ends_at = min(self.session_ends_at + self.session_limit_s, latest)
        return Extended(ends_at=self.session_ends_at, of=self.session_granted_end)

    def session_over(self, now: float | None = None) -> bool:
        """True from :data:`ENFORCE_AFTER_S` after the end: time for the hub to take back
        what the server still holds."""
        now = time.time() if now is None else now
        return bool(self.session_ends_at) and now >= self.session_ends_at + ENFORCE_AFTER_S

    def session_clock_times(self) -> list[float]:
        """When (epoch seconds) the hub needs to look again for the session's sake: the
        time to take back what the server still holds; none without a session running."""
        return [self.session_ends_at + ENFORCE_AFTER_S] if self.session_ends_at else []

    def session_ending(self, now: float | None = None) -> bool:
        """True from :data:`RELEASE_WINDOW_S` before the end: a release now is the session's end."""
        now = time.time() if now is None else now
        return bool(self.session_ends_at) and now >= self.session_ends_at - RELEASE_WINDOW_S

    def session_reason(self) -> str:
        """The hub's words for workers given back at the session's end."""
        return f"{session_limit_why(self.session_limit_s)} reached"

    def session_form_line(self) -> str:
        """The spawn form's line about the limit ("" without one), or the source's own."""
        own = self.workers.session_line()
        if own is not None:
            return own
        if not self.session_limited:
            return ""
        return (f"Sessions last at most {duration(self.session_limit_s)}: your engines are then released, "
                f"your notebook keeps its state, and the next cell asks for workers again.")

    # -- state -------------------------------------------------------------------------

    def session_state(self) -> dict:
        """The session's end, for the core's part of the spawner's state ({} without one)."""
        if not self.session_ends_at:
            return {}
        return {"session_ends_at": self.session_ends_at, "session_granted_end": self.session_granted_end}

    def load_session_state(self, state: dict) -> None:
        """The session's end from :meth:`session_state`'s dict (anything else in it: none)."""

        def seconds(key: str) -> float:
            value = state.get(key, 0.0)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

        self.session_ends_at = seconds("session_ends_at")
        self.session_granted_end = seconds("session_granted_end") or self.session_ends_at
