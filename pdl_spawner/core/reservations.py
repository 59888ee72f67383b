"""The slot ledger: which user holds which slot, persisted in SQLite.

The ledger is the single source of truth for "no slot is ever given to two
users": ``slot`` is the table's primary key, and a reservation takes all of its
slots in one ``BEGIN IMMEDIATE`` transaction. It lives in a file, so it survives
hub restarts; every call opens its own short connection. Every call blocks (SQLite
waits up to 30 s for another connection's write lock): the hub makes them off its
event loop, through :func:`pdl_spawner.hub.db_thread.off_loop`.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pdl_spawner.hub import sqlite_file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS slots (
    slot  TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    since REAL NOT NULL
)
"""
_RECLAIMS = """
CREATE TABLE IF NOT EXISTS reclaims (
    owner  TEXT NOT NULL,
    slots  TEXT NOT NULL,
    at     REAL NOT NULL,
    reason TEXT NOT NULL
)
"""


_GPU_IDLE = """
CREATE TABLE IF NOT EXISTS gpu_idle (
    owner TEXT PRIMARY KEY,
    since REAL NOT NULL
)
"""


class NotEnoughSlots(RuntimeError):
    """A reservation asked for more slots than are free. Nothing was reserved."""

    def __init__(self, wanted: int, free: int, holders: dict[str, int]):
        self.wanted, self.free, self.holders = wanted, free, holders
        super().__init__(f"{wanted} slot(s) requested, {free} free")


@dataclass(frozen=True)
class Reclaim:
    owner: str
    slots: list[str]
    at: float     # epoch seconds
    reason: str   # one line, e.g. "engines idle for 600 s"


@dataclass(frozen=True)
class Holding:
    slot: str
    owner: str
    since: float  # epoch seconds


class SlotLedger:
    """Reservations of named slots by owners (``"user"`` or ``"user/server"``)."""

    def __init__(self, path: str | Path):
        """Touches nothing on disk: the file and its tables are made by the first call."""
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        return sqlite_file.connect(self.path, (_SCHEMA, _RECLAIMS, _GPU_IDLE))

    def reserve(self, owner: str, n: int, pool: list[str]) -> list[str]:
        """Give ``owner`` ``n`` free slots of ``pool`` (first free first); all or nothing.

        Slots ``owner`` already holds are released first. Raises NotEnoughSlots
        (with who holds the rest) when fewer than ``n`` are free, and ValueError when
        ``n`` is not a whole number of at least 1 (whoever asked: a form, a REST body,
        a lease request): the ledger never takes a count it was not checked for.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"a reservation is for a whole number of slots, at least 1; got {n!r}")
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM slots WHERE owner = ?", (owner,))
            held = dict(db.execute("SELECT slot, owner FROM slots").fetchall())
            free = [s for s in pool if s not in held]
            if len(free) < n:
                db.execute("ROLLBACK")
                holders = Counter(o for s, o in held.items() if s in pool)
                raise NotEnoughSlots(n, len(free), dict(holders))
            now = time.time()
            db.executemany(
                "INSERT INTO slots (slot, owner, since) VALUES (?, ?, ?)",
                [(s, owner, now) for s in free[:n]],
            )
            db.execute("COMMIT")
            return free[:n]
        finally:
            db.close()

    def release(self, owner: str) -> list[str]:
        """Free every slot ``owner`` holds; returns them."""
        with self._connect() as db:
            rows = db.execute("SELECT slot FROM slots WHERE owner = ?", (owner,)).fetchall()
            db.execute("DELETE FROM slots WHERE owner = ?", (owner,))
            db.execute("DELETE FROM gpu_idle WHERE owner = ?", (owner,))
        return [r[0] for r in rows]

    def held_by(self, owner: str) -> list[str]:
        with self._connect() as db:
            rows = db.execute("SELECT slot FROM slots WHERE owner = ? ORDER BY slot", (owner,))
            return [r[0] for r in rows.fetchall()]

    def holdings(self) -> list[Holding]:
        """Every reservation, by slot."""
        with self._connect() as db:
            rows = db.execute("SELECT slot, owner, since FROM slots ORDER BY slot").fetchall()
        return [Holding(*r) for r in rows]

    def reclaim(self, owner: str, reason: str) -> list[str]:
        """Free every slot ``owner`` holds and log it as a reclaim (see :meth:`reclaims`)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            rows = [r[0] for r in db.execute("SELECT slot FROM slots WHERE owner = ? ORDER BY slot", (owner,))]
            db.execute("DELETE FROM slots WHERE owner = ?", (owner,))
            db.execute("DELETE FROM gpu_idle WHERE owner = ?", (owner,))
            if rows:
                _insert_reclaim(db, owner, rows, reason)
            db.execute("COMMIT")
        return rows

    def log_reclaim(self, owner: str, what: list[str], reason: str) -> None:
        """Log a reclaim of workers the ledger does not hold (a swarm's GPUs, e.g.
        ``"node1/GPU-0"``), for :meth:`reclaims`."""
        with self._connect() as db:
            _insert_reclaim(db, owner, what, reason)

    def flag_gpu_idle(self, owner: str, since: float | None) -> None:
        """Flag ``owner``'s GPUs as held idle since ``since`` (epoch seconds; None: lift
        the flag), for the admin view (:meth:`gpu_idle_flags`). Freeing the slots lifts it."""
        with self._connect() as db:
            if since is None:
                db.execute("DELETE FROM gpu_idle WHERE owner = ?", (owner,))
            else:
                db.execute("INSERT OR REPLACE INTO gpu_idle (owner, since) VALUES (?, ?)", (owner, since))

    def gpu_idle_flags(self) -> dict[str, float]:
        """Owner -> since when their GPUs have been held idle, for every flag standing."""
        with self._connect() as db:
            return dict(db.execute("SELECT owner, since FROM gpu_idle ORDER BY owner").fetchall())

    def reclaims(self, limit: int = 50) -> list[Reclaim]:
        """The most recent reclaims, newest first."""
        with self._connect() as db:
            rows = db.execute("SELECT owner, slots, at, reason FROM reclaims ORDER BY at DESC LIMIT ?",
                              (limit,)).fetchall()
        return [Reclaim(owner, slots.split(","), at, reason) for owner, slots, at, reason in rows]


def _insert_reclaim(db: sqlite3.Connection, owner: str, what: list[str], reason: str) -> None:
    db.execute("INSERT INTO reclaims (owner, slots, at, reason) VALUES (?, ?, ?, ?)",
               (owner, ",".join(what), time.time(), reason))
