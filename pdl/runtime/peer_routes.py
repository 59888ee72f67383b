"""Whether this rank reaches its peers' addresses yet, asked before a process group
connects across hosts.

On an overlay network (Docker Swarm's), a node routes to a container on another node
only once its own Docker engine has learnt where that container runs, which under
load can come seconds after the container started. gloo gives up on a peer at its
first "No route to host", so a group formed in that window fails although the network
would have carried it a moment later. A peer counts as reached once a TCP connection
to its address is answered, accepted or refused: either answer means packets went
there and back.
"""

from __future__ import annotations

import errno
import socket
import time

#: The port each probe connects to (discard): closed on an engine, so a reached peer refuses.
PROBE_PORT = 9
#: Seconds one probe waits for an answer.
PROBE_S = 1.0
#: Seconds between rounds of probes to the peers not reached yet.
ROUND_PAUSE_S = 0.2
#: The answers that prove a route: accepted, or refused by the peer's kernel.
ANSWERED = (0, errno.ECONNREFUSED)


def unreached_peers(addrs: list[str], within_s: float) -> list[str]:
    """The IPv4 addresses of ``addrs`` that answered no probe within ``within_s``
    seconds (sorted; empty once all did)."""
    pending = set(addrs)
    deadline = time.monotonic() + within_s
    while pending:
        for addr in sorted(pending):
            if probe(addr, max(0.05, min(PROBE_S, deadline - time.monotonic()))) in ANSWERED:
                pending.discard(addr)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(ROUND_PAUSE_S)
    return sorted(pending)


def probe(addr: str, timeout_s: float) -> int:
    """One TCP connection attempt to ``addr``: 0 when accepted, else its errno
    (``ETIMEDOUT`` when nothing answered within ``timeout_s`` seconds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect((addr, PROBE_PORT))
        except socket.timeout:
            return errno.ETIMEDOUT
        except OSError as e:
            return e.errno or errno.EIO
        return 0
