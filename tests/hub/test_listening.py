"""pdl_spawner.host.listening: a spawn's start returns once the server listens on its
port, not before, and never waits on a server that has died or never listens."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

from hub_harness import free_port

from pdl_spawner.host.listening import wait_until_listening

#: A stand-in server process: it listens on the port in argv[1] after argv[2] seconds,
#: then prints when it did (its clock is the machine's monotonic clock).
LATE_LISTENER = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print(time.monotonic(), flush=True)
time.sleep(60)
"""


def run(coroutine):
    """The coroutine's result; TimeoutError after 30 s."""
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_returns_once_the_server_listens_and_not_before():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", LATE_LISTENER, str(port), "1.0"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert run(wait_until_listening("127.0.0.1", port, timeout_s=20, ended=lambda: server.poll() is not None))
        returned = time.monotonic()
        listening_since = float(server.stdout.readline())
        assert returned >= listening_since, "it returned before the server listened"
    finally:
        server.kill()
        server.wait()


def test_a_server_that_exits_before_it_listens_ends_the_wait():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        # well inside its 60 s: run() gives up at 30
        assert not run(wait_until_listening("127.0.0.1", port, timeout_s=60, ended=lambda: server.poll() is not None))
    finally:
        server.kill()
        server.wait()


def test_a_server_that_never_listens_ends_the_wait_at_its_timeout():
    port = free_port()
    with socket.socket() as held:  # bound, never listening: every connect is refused
        held.bind(("127.0.0.1", port))
        assert not run(wait_until_listening("127.0.0.1", port, timeout_s=0.5, ended=lambda: False))
