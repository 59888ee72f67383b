"""When a server just started first accepts connections on its port.

JupyterHub learns that a server is up by polling its URL with an exponential backoff
(waits drawn up to 0.2, 0.4, 0.8, 1.6, 3.2 s, then 5 s): a server that is up after
1.8 s is seen on average a second later, and up to 3 s later, while its user looks at
the spawn page. :func:`wait_until_listening` watches the port closely instead (a TCP
connect every :data:`POLL_S`, nothing sent), so that a spawner's ``start`` returns once
the server listens and the hub's first poll finds it.

It only says when to let the hub look: the hub still checks the server over HTTP
itself, so a server that accepts connections and answers nothing is refused as any
other, and a port a stranger holds earns nothing (each server binds only its own port,
:mod:`pdl_spawner.host.port_filter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

#: Seconds between two connects to the server's port.
POLL_S = 0.05
#: Seconds one connect may take before it counts as not listening yet.
CONNECT_TIMEOUT_S = 1.0


async def wait_until_listening(address: str, port: int, *, timeout_s: float, ended: Callable[[], bool]) -> bool:
    """True once ``address:port`` accepts a TCP connection; False when ``ended()`` says
    the server's process is gone, or after ``timeout_s`` seconds (the caller's hub
    then waits and reports the failure as it would have)."""
    deadline = time.monotonic() + timeout_s
    while not ended():
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            if time.monotonic() + POLL_S > deadline:
                return False
            await asyncio.sleep(POLL_S)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False
