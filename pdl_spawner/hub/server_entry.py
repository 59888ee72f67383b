"""The hub's side of a user's origin: the way on to a running server, and the stranger's
answer where none runs.

- JupyterHub's ``UserUrlHandler`` (``/hub/user/<name>/...``) sends a user who may use a
  running server on to it. A PDL server answers any request without credentials it
  accepts as the hub answers for a stopped server (:mod:`pdl_server.entry_gate`), so that
  no visitor can tell who is working now; :class:`PDLUserUrlHandler` adds the hub's entry
  ticket (:mod:`pdl.entry_ticket`) to that address, with which the server begins its own
  OAuth login as JupyterHub's would. Only this handler makes tickets, after JupyterHub
  has checked the user's login and ``access:servers`` scope.
- JupyterHub's ``PrefixRedirectHandler`` answers every path outside ``/hub/``, among them
  ``<name>.<hub>/user/<name>/...`` where no server of ``<name>``'s runs (the proxy's
  default route). :class:`PDLPrefixRedirectHandler` gives a request there the stranger's
  path a running server's gate gives it: any token it carries checked with the hub's API
  as a server checks it (JupyterHub's ``HubAuth``), then the request relayed to the hub
  and the hub's answer written back (:func:`pdl.hub_relay.answer_from_hub`), so that the
  two answer the same in words and in time. A relayed request (the hub's mark) gets
  JupyterHub's answer.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from jupyterhub.handlers.base import AddSlashHandler, PrefixRedirectHandler, UserUrlHandler
from jupyterhub.services.auth import HubAuth
from tornado import web
from tornado.httputil import url_concat

from pdl import entry_ticket, hub_relay


class PDLUserUrlHandler(UserUrlHandler):
    """JupyterHub's handler, its redirect to a ready server carrying an entry ticket."""

    _entry_ticket: str | None = None

    async def _redirect_to_user_server(self, user, spawner):
        self._entry_ticket = entry_ticket.issue(self.settings["cookie_secret"], user.name)
        try:
            await super()._redirect_to_user_server(user, spawner)
        finally:
            self._entry_ticket = None

    def redirect(self, url: str, *args, **kwargs) -> None:
        if self._entry_ticket is not None:
            url = url_concat(url, {entry_ticket.PARAM: self._entry_ticket})
        super().redirect(url, *args, **kwargs)


class StandsInForAServer:
    """Mixin for JupyterHub's handlers of paths outside ``/hub/``: at a user's origin,
    under ``/user/``, and not relayed, the stranger's answer a running server gives (the
    module's second point)."""

    #: the token check a server makes (HubAuth against this hub's API), made once per hub
    _servers_check: HubAuth | None = None

    def _own_origin(self) -> str:
        """The hub's own address, as the servers reach it (its connect URL's origin), or
        127.0.0.1 where it listens on every interface."""
        hub = self.hub
        if hub.ip in ("", "0.0.0.0", "::", "127.0.0.1"):
            return f"{hub.proto}://127.0.0.1:{hub.port}"
        return hub.host

    def _stands_in_for_a_server(self, mark: str) -> bool:
        hub_host = urlsplit(self.subdomain_host).netloc.lower() if self.subdomain_host else ""
        return (bool(hub_host) and self.request.host.lower() != hub_host
                and self.request.path.startswith(f"{self.base_url}user/")
                and not hub_relay.is_marked(self.request, mark))

    async def prepare(self):
        mark = hub_relay.relay_mark(self.settings["cookie_secret"])
        if not self._stands_in_for_a_server(mark):
            return await super().prepare()
        if StandsInForAServer._servers_check is None:
            StandsInForAServer._servers_check = HubAuth(api_url=f"{self._own_origin()}{self.hub.base_url}api",
                                                        api_token="", cache_max_age=300)
        await self._servers_check.get_user(self, sync=False)  # as a server's gate does: any token checked
        await hub_relay.answer_from_hub(self, self._own_origin(), mark)
        raise web.Finish()


class PDLPrefixRedirectHandler(StandsInForAServer, PrefixRedirectHandler):
    """JupyterHub's redirect of paths outside ``/hub/`` into it, standing in for a server."""


class PDLAddSlashHandler(StandsInForAServer, AddSlashHandler):
    """JupyterHub's ``/user/<name>`` -> ``/user/<name>/``, standing in for a server."""


#: JupyterHub's handlers of the routes outside its prefix -> PDL's. JupyterHub adds these
#: routes to its table after it sets it (a ``handlers`` observer does not see them), from
#: its ``jupyterhub.handlers`` package: :func:`fit_outside_prefix` replaces them there.
OUTSIDE_PREFIX = {"PrefixRedirectHandler": PDLPrefixRedirectHandler, "AddSlashHandler": PDLAddSlashHandler}


def fit_outside_prefix() -> None:
    """In the hub's process, before JupyterHub builds its route table: the routes outside
    ``/hub/`` get :data:`OUTSIDE_PREFIX`'s handlers."""
    import jupyterhub.handlers

    for name, fitted in OUTSIDE_PREFIX.items():
        setattr(jupyterhub.handlers, name, fitted)
