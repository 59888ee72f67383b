"""The one thread a process of PDL starts its engines, controller and warm parent from.

Linux's parent-death signal follows the *thread* that forked a child, so a child started
from a thread that ends (a worker thread, a kernel subshell) would die with it: every such
child is started on :data:`_LAUNCHER`, idle between starts, which ends only with the process.
"""

from __future__ import annotations

import concurrent.futures
import threading

#: The thread every engine and controller is started from; idle between starts, it
#: ends only with the process.
_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdl-launcher")


def on_launcher_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run on the launcher thread (blocking; its result or its
    exception), so that processes it starts live as long as this process."""
    if threading.current_thread().name.startswith("pdl-launcher"):
        return fn(*args, **kwargs)
    return _LAUNCHER.submit(fn, *args, **kwargs).result()
