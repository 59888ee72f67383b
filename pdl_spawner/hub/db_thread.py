"""The hub's blocking calls (SQLite: the slot ledger, the queue), run off its event loop.

A SQLite call may wait up to its timeout (30 s) for another connection's write lock;
made on the event loop it would freeze every user's page for as long. Every ledger
and queue call of a spawner goes through :func:`off_loop` (awaited) or, from a
synchronous JupyterHub hook such as ``clear_state``, :func:`submit`. Both run on one
thread, in the order they were made: a release submitted by ``clear_state`` is done
before a reservation asked for after it.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdl-db")


async def off_loop(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on the hub's database thread; its result or exception."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs))


def submit(fn: Callable[..., T], *args, **kwargs) -> Future:
    """Queue ``fn(*args, **kwargs)`` on the database thread without waiting for it."""
    return _EXECUTOR.submit(fn, *args, **kwargs)
