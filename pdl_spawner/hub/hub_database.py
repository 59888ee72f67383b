"""JupyterHub's own database, when it is SQLite (PDL's default), in WAL mode with
``synchronous=NORMAL``.

JupyterHub runs every query of its database on its one event loop, and commits several
times for each spawn and stop (the server's row, its API token, its OAuth client, its
state). In SQLite's default journal each commit waits for the disk (fsync): in a burst
of 20 spawns at once, most of the hub's busy time on its loop was spent in those
commits, and every request, refusals included, waited behind them. In WAL mode with
``synchronous=NORMAL`` a commit appends to the write-ahead log without waiting for the
disk; the file is synced at checkpoints. A crash of the hub loses nothing; a power
loss may lose the last commits (never the file): the next hub polls every server it
knows and forgets the ones that are gone.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import event
from sqlalchemy.engine import Engine

_listening = False


def _tune(dbapi_connection, _record) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()


def use_write_ahead_log() -> None:
    """Every SQLite connection SQLAlchemy opens in this process from now on (JupyterHub's
    own) in WAL mode, ``synchronous=NORMAL``; other databases untouched. Once per process."""
    global _listening
    if not _listening:
        event.listen(Engine, "connect", _tune)
        _listening = True
