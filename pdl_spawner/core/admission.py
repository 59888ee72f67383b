"""Spawns admitted before JupyterHub prepares them: what a burst of requests has promised.

A spawn request is answered by PDL first (:meth:`SpawnerCore.admit_spawn
<pdl_spawner.core.spawner.SpawnerCore.admit_spawn>`, called by the hub's spawn routes,
:mod:`pdl_spawner.hub.spawn_routes`): a refusal at once, before JupyterHub makes the
server's row, tokens and OAuth client, or an admission. An admitted spawn takes its
workers only later, in ``start()``; until then its workers count as held for every
other request's answer, so that 20 requests at once are not all admitted to 6 free
workers. :data:`ADMISSIONS` keeps them, in the hub process's memory (nothing outlives
the process: a spawn in flight dies with its hub).

An admission ends when its spawn takes its workers or fails to (the take, under the
hub's take lock), when its request fails before ``start()``, and at the latest
:data:`ADMISSION_HOLD_S` after it was made (a spawn that never reached its take counts
no longer). The ledger (or the cluster) stays the one authority: an admission is only
the reason a request is answered early; ``start()`` takes for real and may still refuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds an admission counts at most, if its spawn neither takes its workers nor fails
#: (JupyterHub's spawn of an admitted request reaches ``start()`` within a second or two).
ADMISSION_HOLD_S = 30.0


@dataclass(frozen=True)
class Admission:
    """One admitted spawn: its ``user``, the ``workers`` it asked for, of ``gpu_type``
    ("" : any), and the monotonic time (seconds) ``until`` which it counts."""

    user: str
    workers: int
    gpu_type: str
    until: float


class Admissions:
    """The admitted spawns of one hub process, by server (``user/name``). Not thread-safe:
    used on the hub's event loop only, under its take lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, hold_s: float = ADMISSION_HOLD_S):
        self._clock = clock
        self._hold_s = hold_s
        self._admitted: dict[str, Admission] = {}

    def admit(self, key: str, user: str, workers: int, gpu_type: str = "") -> Admission:
        """Count ``workers`` (of ``gpu_type``, "" : any) as held by ``user`` for the server
        ``key``, replacing what it had, for :data:`ADMISSION_HOLD_S` at most; the admission."""
        admission = self._admitted[key] = Admission(user, workers, gpu_type, self._clock() + self._hold_s)
        return admission

    def drop(self, key: str, admission: Admission | None = None) -> None:
        """The server ``key`` took its workers, or will not: it counts no longer (no-op if
        it had no admission). With ``admission``: only if that is still the server's (a
        second request for a running spawn ends its own admission, not the first's)."""
        if admission is None or self._admitted.get(key) is admission:
            self._admitted.pop(key, None)

    def held_by_others(self, key: str, gpu_type: str = "") -> dict[str, int]:
        """User -> workers admitted to servers other than ``key``, of ``gpu_type`` (every
        type for "" ; for a type, only admissions of that very type: one for any type may
        land elsewhere, and an early answer must never refuse what ``start()`` would grant).
        Admissions past their time are forgotten here."""
        now = self._clock()
        for gone in [k for k, a in self._admitted.items() if a.until <= now]:
            del self._admitted[gone]
        held: dict[str, int] = {}
        for k, a in self._admitted.items():
            if k != key and (not gpu_type or a.gpu_type == gpu_type):
                held[a.user] = held.get(a.user, 0) + a.workers
        return held

    def __len__(self) -> int:
        return len(self._admitted)


#: The hub process's admissions, shared by every spawner.
ADMISSIONS = Admissions()
