"""The largest request body the hub reads, for every handler of the hub process.

JupyterHub builds its HTTP server without ``max_body_size``, so tornado's default of
100 MB applied: three 20 MB bodies posted to the hub's API stalled it 3.3 s while it read
and parsed them. :func:`limit_request_bodies` (called from ``jupyterhub_config.py``,
before the hub makes its server) sets the limit for every tornado ``HTTPServer`` the
process makes afterwards. A request whose ``Content-Length`` is larger is answered
``400 Bad Request`` and closed after its headers: the body is never read.
"""

from __future__ import annotations

from tornado.httpserver import HTTPServer

#: The default limit, bytes: the hub's forms and API take a few kilobytes (a spawn's
#: options, a token request); notebooks and uploads go to the users' own servers.
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024


def limit_request_bodies(max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
    """Make ``max_bytes`` (> 0) the largest body any HTTPServer made from now on in this
    process reads; ValueError for another value."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"the largest request body must be a positive number of bytes, got {max_bytes!r}")
    HTTPServer.configure(None, max_body_size=max_bytes)
