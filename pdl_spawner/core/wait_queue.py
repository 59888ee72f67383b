"""The fair queue: users waiting for busy workers, first come first served.

A spawn that asks to wait (``user_options["queue"]``) joins the queue instead of
failing. Only the user at the head may take workers when enough are free, so
nobody is overtaken; a direct spawn is refused while anyone waits. Each waiter
beats every second; an entry whose waiter stopped beating (the hub crashed, the
spawn was cancelled) is dropped after :data:`STALE_AFTER_S`, so a dead entry never
blocks the queue. Leaving is :meth:`WaitQueue.leave` (a cancelled spawn does it).

The queue lives in SQLite next to the slot ledger; every call opens its own short
connection, so admin views and several spawners read one truth. Reads never write
(stale entries are filtered out, and purged by the next write), so a reader is not
held up by another connection's write lock; the hub makes every call off its event
loop all the same (:func:`pdl_spawner.core.db_thread.off_loop`).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from pdl_spawner.core import sqlite_file

#: Seconds without a beat after which a waiter is considered gone.
STALE_AFTER_S = 15.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    owner  TEXT PRIMARY KEY,
    user   TEXT NOT NULL,
    wanted INTEGER NOT NULL,
    since  REAL NOT NULL,
    beat   REAL NOT NULL
)
"""


@dataclass(frozen=True)
class Waiter:
    owner: str     # "user" or "user/server"
    user: str
    wanted: int    # workers (slots or GPUs)
    since: float   # epoch seconds when it joined


class WaitQueue:
    """First-come-first-served waiters for workers, persisted in SQLite at ``path``."""

    def __init__(self, path: str | Path, stale_after_s: float = STALE_AFTER_S):
        """Touches nothing on disk: the file and its table are made by the first call."""
        self.path = Path(path)
        self.stale_after_s = stale_after_s

    def _connect(self) -> sqlite3.Connection:
        return sqlite_file.connect(self.path, (_SCHEMA,))

    def _purge_stale(self, db: sqlite3.Connection) -> None:
        db.execute("DELETE FROM queue WHERE beat < ?", (time.time() - self.stale_after_s,))

    def join(self, owner: str, user: str, wanted: int) -> int:
        """Add ``owner`` at the end (kept in place if already waiting); returns its position (1-based)."""
        now = time.time()
        with self._connect() as db:
            self._purge_stale(db)
            db.execute(
                "INSERT INTO queue (owner, user, wanted, since, beat) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(owner) DO UPDATE SET wanted = excluded.wanted, beat = excluded.beat",
                (owner, user, wanted, now, now),
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
            rows = db.execute("SELECT owner, user, wanted, since FROM queue WHERE beat >= ? ORDER BY since, rowid",
                              (time.time() - self.stale_after_s,)).fetchall()
        return [Waiter(*row) for row in rows]

    def position(self, owner: str) -> int:
        """1 for the head; 0 if ``owner`` is not waiting."""
        owners = [w.owner for w in self.waiters()]
        return owners.index(owner) + 1 if owner in owners else 0

    def ahead_of(self, owner: str | None = None) -> list[Waiter]:
        """Waiters ahead of ``owner`` (everyone, for someone not in the queue)."""
        waiters = self.waiters()
        owners = [w.owner for w in waiters]
        return waiters[: owners.index(owner)] if owner in owners else waiters
