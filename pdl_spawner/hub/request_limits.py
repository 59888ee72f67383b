"""The largest request body, and the largest request line and headers, the hub reads,
for every handler of the hub process.

JupyterHub builds its HTTP server without ``max_body_size`` or ``max_header_size``, so
tornado's defaults of 100 MB and 64 KiB applied: three 20 MB bodies posted to the hub's
API stalled it 3.3 s while it read and parsed them. :func:`limit_request_bodies` (called
from ``jupyterhub_config.py``, before the hub makes its server) sets both limits for
every tornado ``HTTPServer`` the process makes afterwards. A request whose
``Content-Length`` is larger than the body limit is answered ``400 Bad Request`` and
closed after its headers: the body is never read. A request whose line and headers
together are larger than :data:`MAX_HEADER_BYTES` is closed unanswered once that many
bytes came without their end.
"""

from __future__ import annotations

from tornado.httpserver import HTTPServer

#: The default limit, bytes: the hub's forms and API take a few kilobytes (a spawn's
#: options, a token request); notebooks and uploads go to the users' own servers.
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
#: The most bytes of a request's line and headers together. The hub's own cookies take
#: well under 2 KiB (its login and session cookies, ``_xsrf``, one ``pdl-known-<name>``
#: per name a browser logged in as); the proxy in front of the hub (Node's HTTP server)
#: passes at most 16 KiB of headers, and adds its ``X-Forwarded-*`` lines to them.
MAX_HEADER_BYTES = 32 * 1024


def limit_request_bodies(max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
    """Make ``max_bytes`` (> 0) the largest body, and :data:`MAX_HEADER_BYTES` the largest
    request line and headers, that any HTTPServer made from now on in this process reads;
    ValueError for another ``max_bytes``."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"the largest request body must be a positive number of bytes, got {max_bytes!r}")
    # one call: each configure() replaces the keyword arguments the last one set
    HTTPServer.configure(None, max_body_size=max_bytes, max_header_size=MAX_HEADER_BYTES)
