"""The fair queue: users waiting for busy workers, first come first served.

A spawn that asks to wait (``user_options["queue"]``) joins the queue instead of
failing. Only the user at the head may take workers when enough are free, so
nobody is overtaken; a direct spawn is refused while anyone waits. Where spawns
choose a GPU type, waiters compete only with those for the same type or for any
type (``""``): someone waiting for a T4 neither holds up nor is overtaken by a spawn
for an A100. Each waiter
beats every second; an entry whose waiter stopped beating (the hub crashed, the
spawn was cancelled) is dropped after :data:`STALE_AFTER_S`, so a dead entry never
blocks the queue. Leaving is :meth:`WaitQueue.leave` (a cancelled spawn does it).

The queue lives in SQLite next to the slot ledger; every call opens its own short
connection, so admin views and several spawners read one truth. Reads never write
(stale entries are filtered out, and purged by the next write), so a reader is not
held up by another connection's write lock; the hub makes every call off its event
loop all the same (:func:`pdl_spawner.hub.db_thread.off_loop`).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from pdl_spawner.hub import sqlite_file

#: Queue files this process has given the ``gpu_type`` column.
_typed: set[Path] = set()

#: Seconds without a beat after which a waiter is considered gone.
STALE_AFTER_S = 15.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    owner  TEXT PRIMARY KEY,
    user   TEXT NOT NULL,
    wanted INTEGER NOT NULL,
    since  REAL NOT NULL,
    beat   REAL NOT NULL,
    gpu_type TEXT NOT NULL DEFAULT ''
)
"""


@dataclass(frozen=True)
class Waiter:
    owner: str     # "user" or "user/server"
    user: str
    wanted: int    # workers (slots or GPUs)
    since: float   # epoch seconds when it joined
    gpu_type: str = ""  # the GPU type it waits for ("" : any)

    def competes_with(self, gpu_type: str) -> bool:
        """Whether this waiter and a spawn for ``gpu_type`` want the same workers: the
        same type, or either takes any."""
        return not self.gpu_type or not gpu_type or self.gpu_type == gpu_type


class WaitQueue:
    """First-come-first-served waiters for workers, persisted in SQLite at ``path``."""

    def __init__(self, path: str | Path, stale_after_s: float = STALE_AFTER_S):
        """Touches nothing on disk: the file and its table are made by the first call."""
        self.path = Path(path)
        self.stale_after_s = stale_after_s

    def _connect(self) -> sqlite3.Connection:
        db = sqlite_file.connect(self.path, (_SCHEMA,))
        if self.path not in _typed:  # a file from before GPU types: add the column, once
            if "gpu_type" not in [row[1] for row in db.execute("PRAGMA table_info(queue)")]:
                try:
                    db.execute("ALTER TABLE queue ADD COLUMN gpu_type TEXT NOT NULL DEFAULT ''")
                except sqlite3.OperationalError:  # another process added it first
                    pass
            _typed.add(self.path)
        return db

    def _purge_stale(self, db: sqlite3.Connection) -> None:
        db.execute("DELETE FROM queue WHERE beat < ?", (time.time() - self.stale_after_s,))

    def join(self, owner: str, user: str, wanted: int, gpu_type: str = "") -> int:
        """Add ``owner`` at the end, waiting for ``wanted`` workers of ``gpu_type`` ("" :
        any; kept in place if already waiting); returns its position (1-based)."""
        now = time.time()
        with self._connect() as db:
            self._purge_stale(db)
            db.execute(
                "INSERT INTO queue (owner, user, wanted, since, beat, gpu_type) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(owner) DO UPDATE SET wanted = excluded.wanted, beat = excluded.beat, "
                "gpu_type = excluded.gpu_type",
                (owner, user, wanted, now, now, gpu_type),
            )
        return self.position(owner)

    def beat(self, owner: str) -> None:
        """Say ``owner`` still waits."""
        with self._connect() as db:
            db.execute("UPDATE queue SET beat = ? WHERE owner = ?", (time.time(), owner))

    def leave(self, owner: str) -> bool:
        """Take ``owner`` out of the queue; True if it was waiting."""
        with self._connect() as db:
            return db.execute("DELETE FROM queue WHERE owner = ?", (owner,)).rowcount > 0

    def waiters(self) -> list[Waiter]:
        """Everyone waiting, first come first; stale entries are left out."""
        with self._connect() as db:
            rows = db.execute("SELECT owner, user, wanted, since, gpu_type FROM queue WHERE beat >= ? "
                              "ORDER BY since, rowid", (time.time() - self.stale_after_s,)).fetchall()
        return [Waiter(*row) for row in rows]

    def position(self, owner: str) -> int:
        """1 for the head of ``owner``'s line (the waiters it competes with); 0 if it is not waiting."""
        mine = next((w for w in self.waiters() if w.owner == owner), None)
        return 0 if mine is None else 1 + len(self.ahead_of(owner, mine.gpu_type))

    def ahead_of(self, owner: str | None = None, gpu_type: str = "") -> list[Waiter]:
        """Waiters ahead of ``owner`` (everyone, for someone not in the queue) that
        compete with a spawn for ``gpu_type`` (:meth:`Waiter.competes_with`)."""
        waiters = self.waiters()
        owners = [w.owner for w in waiters]
        ahead = waiters[: owners.index(owner)] if owner in owners else waiters
        return [w for w in ahead if w.competes_with(gpu_type)]
