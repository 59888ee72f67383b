"""The supervisor's and a kernel's side of the engine lease's API
(:mod:`pdl_server.lease_api`): blocking HTTP calls to the user's own Jupyter server,
with its token, straight to it (no proxy). Every call answers None (or False) when the
server cannot be reached or says no, after :data:`REQUEST_TIMEOUT_S` at most (plus the
wait of a long poll), and never raises for it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

from pdl.lease import Grant, LeaseFormatError, LeaseView, Release, Want, encode

#: Seconds a call waits for the server, besides a long poll's own wait.
REQUEST_TIMEOUT_S = 10.0

#: Straight to the user's server, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LeaseClient:
    """Calls to the lease API at ``url`` (``http://host:port/<base_url>pdl/api/lease``)
    with ``token`` (the server's API token)."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url.rstrip("/"), token

    @classmethod
    def of_this_server(cls, environ: Mapping[str, str] | None = None, token: str | None = None) -> LeaseClient | None:
        """The client of the Jupyter server this process runs under or beside
        (:func:`server_address`, and the path of ``JUPYTERHUB_SERVICE_URL``) with
        ``JUPYTERHUB_API_TOKEN`` (or ``token``); None without them."""
        environ = os.environ if environ is None else environ
        address, token = server_address(environ), token or environ.get("JUPYTERHUB_API_TOKEN", "")
        if address is None or not token:
            return None
        host, port = address
        host = f"[{host}]" if ":" in host else host
        path = urlsplit(environ["JUPYTERHUB_SERVICE_URL"]).path.rstrip("/")
        return cls(f"http://{host}:{port}{path}/pdl/api/lease", token)

    # -- reading ------------------------------------------------------------------------

    def view(self, after: LeaseView | None = None, wait_s: float = 0.0) -> LeaseView | None:
        """The lease now; with ``after`` (a view read before), once it has changed since,
        or after ``wait_s`` seconds as it is then."""
        query = "" if after is None else "?" + urlencode({"after": after.version, "epoch": after.epoch,
                                                          "wait": wait_s})
        return self._view(self._call("GET", query, None, wait_s if after is not None else 0.0))

    # -- the supervisor's ---------------------------------------------------------------

    def begin_release(self, idle_s: float | None = None) -> bool:
        """Ask to stop the engines (:meth:`pdl_server.lease_owner.LeaseOwner.begin_release`):
        True when they may be stopped now."""
        answer = self._call("POST", "/releasing", {"idle_s": idle_s})
        return bool(answer and answer.get("ok") is True)

    def end_release(self, release: Release | None) -> bool:
        """The release begun is made (``release``) or not (None); True once the server has it."""
        return self._call("POST", "/released", {} if release is None else encode(release)) is not None

    def take_up(self, grant: Grant) -> bool:
        """The engines are back as ``grant`` says; True once the server has it."""
        return self._call("POST", "/held", encode(grant)) is not None

    # -- a kernel's ---------------------------------------------------------------------

    def cell_start(self) -> LeaseView | None:
        """A distributed cell starts: the lease, once any release being made is made."""
        return self._view(self._call("POST", "/cell-start", {}))

    def ask_again(self, want: Want) -> LeaseView | None:
        """Ask for the released workers again."""
        return self._view(self._call("POST", "/want", encode(want)))

    def forget_request(self) -> LeaseView | None:
        """End the request (its refusal read, or given up)."""
        return self._view(self._call("POST", "/forget", {}))

    # -- the exchange -------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict | None, wait_s: float = 0.0) -> dict | None:
        request = urllib.request.Request(
            self.url + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        try:
            with _OPENER.open(request, timeout=REQUEST_TIMEOUT_S + wait_s) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError):  # not listening, an HTTP error, a timeout, not JSON
            return None
        return answer if isinstance(answer, dict) else None

    @staticmethod
    def _view(body: dict | None) -> LeaseView | None:
        if body is None:
            return None
        try:
            return LeaseView.from_json(body)
        except LeaseFormatError:
            return None


def server_address(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Where the user's Jupyter server listens, from ``JUPYTERHUB_SERVICE_URL`` (the hub's
    URL for it; all interfaces: this machine's loopback); None without one."""
    url = urlsplit(environ.get("JUPYTERHUB_SERVICE_URL", ""))
    try:
        port = url.port
    except ValueError:
        return None
    if not port:
        return None
    return ("127.0.0.1" if url.hostname in (None, "", "0.0.0.0", "::") else url.hostname, port)
