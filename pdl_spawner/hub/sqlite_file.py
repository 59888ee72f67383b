"""The hub's SQLite files (the slot ledger, the queue): one way to open them.

Every call opens its own short connection (:func:`connect`), in WAL mode so that
readers never wait for a writer, waiting up to 30 s for another connection's write
lock. The first connection of a process to a file also makes the file, switches it
to WAL and creates the tables, under an exclusive ``flock`` on ``<file>.lock``: several
processes that open a new file at once (the hub and its admin view at first start)
would otherwise race to change its journal mode, which SQLite answers with "database
is locked" at once, without waiting.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

#: Seconds a connection waits for another connection's lock.
LOCK_TIMEOUT_S = 30

#: (file, schema) pairs this process has set up (journal mode and tables).
_ready: set[tuple[Path, tuple[str, ...]]] = set()


def connect(path: str | os.PathLike, schema: tuple[str, ...]) -> sqlite3.Connection:
    """A new autocommit connection to ``path`` (WAL mode), with the ``schema`` statements
    (``CREATE TABLE IF NOT EXISTS ...``) run once per process. Blocks: call it off the
    hub's event loop."""
    path = Path(path)
    if (path, schema) not in _ready:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            db = _open(path)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                for statement in schema:
                    db.execute(statement)
            finally:
                db.close()
        _ready.add((path, schema))
    return _open(path)  # WAL mode is the file's own, once set


def _open(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=LOCK_TIMEOUT_S, isolation_level=None)
