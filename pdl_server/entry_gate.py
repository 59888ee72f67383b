"""The user's server answers strangers as the hub answers for a stopped server.

Without this, ``http://<name>.<hub>/user/<name>/api/status`` answered an anonymous
visitor 403 where ``<name>``'s server ran and 302 (the hub's redirect to
``/hub/user/<name>/...``) for anyone else: a visitor could list who is working now, and
which names have accounts. Every request to this server passes the gate first (a Jupyter
server extension, :func:`_load_jupyter_server_extension`, for every route, static files,
the 404 page and the OAuth callback included). It goes on to the route's own handler when
it carries

- credentials the server accepts (JupyterHub's identity provider: a token or the
  server's login cookie, of a user with access to this server);
- a valid entry ticket of the hub (:mod:`pdl.entry_ticket`, the query argument
  ``pdl_entry``), which the hub adds when it sends a logged-in user on to this server
  (:mod:`pdl_spawner.hub.server_entry`): the server then begins its own OAuth login;
- or, at ``oauth_callback``, the state cookie this server set when it began a login.

Any other request is relayed to the hub's own address (``JUPYTERHUB_API_URL``'s) and
the hub's answer is this server's (:func:`pdl.hub_relay.answer_from_hub`): what the hub
answers at that path when no server runs there, which the hub itself gives strangers
through the same relay, so that the answer is the same in words and in time. Without the
hub's key and mark (a hub that did not tell them) the gate stays open and the server
answers as JupyterHub's does (the log says so once).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from tornado import web

from pdl import entry_ticket, hub_relay
from pdl.contract import ServerContract


class EntryGate:
    """The gate of one server: who passes (:meth:`admits`), and the hub's answer for the
    rest (:meth:`answer_as_hub`)."""

    def __init__(self, identity_provider, user: str, key: str, mark: str, hub_origin: str):
        self.identity_provider, self.user, self.key, self.mark = identity_provider, user, key, mark
        self.hub_origin = hub_origin

    async def admits(self, handler: web.RequestHandler) -> bool:
        """Whether ``handler``'s request goes on to its route (see the module's list)."""
        if self._callback_with_own_state(handler):
            return True
        if await self.identity_provider.get_user(handler) is not None:
            return True
        return entry_ticket.valid(self.key, self.user, handler.get_query_argument(entry_ticket.PARAM, ""))

    def _callback_with_own_state(self, handler: web.RequestHandler) -> bool:
        from jupyterhub.services.auth import HubOAuthCallbackHandler

        if not isinstance(handler, HubOAuthCallbackHandler):
            return False
        state = handler.get_query_argument("state", "")
        hub_auth = self.identity_provider.hub_auth
        try:
            cookie = handler.get_secure_cookie(hub_auth.get_state_cookie_name(state))
        except Exception:  # a state that is not one of ours
            return False
        return bool(state) and cookie is not None and cookie.decode("ascii", "replace") == state

    async def answer_as_hub(self, handler: web.RequestHandler) -> None:
        """Write the hub's answer to ``handler``'s request as this server's, and finish it."""
        await hub_relay.answer_from_hub(handler, self.hub_origin, self.mark)


class GatedHandler:
    """Mixin put before a route's handler class: the gate first (:attr:`entry_gate`)."""

    entry_gate: EntryGate

    async def prepare(self):
        if not await self.entry_gate.admits(self):
            await self.entry_gate.answer_as_hub(self)
            raise web.Finish()
        result = super().prepare()
        if result is not None:
            await result


def install(web_app: web.Application, gate: EntryGate) -> None:
    """Every handler ``web_app`` makes from now on passes ``gate`` first: tornado makes
    each request's handler through ``get_handler_delegate``, which this wraps to make a
    gated subclass of the route's class instead (one per class, kept)."""
    original = web_app.get_handler_delegate
    gated: dict[type, type] = {}

    def get_handler_delegate(request, target_class, *args, **kwargs):
        subclass = gated.get(target_class)
        if subclass is None:
            subclass = gated[target_class] = type(f"Gated{target_class.__name__}", (GatedHandler, target_class),
                                                  {"entry_gate": gate})
        return original(request, subclass, *args, **kwargs)

    web_app.get_handler_delegate = get_handler_delegate


def _load_jupyter_server_extension(serverapp) -> None:
    contract = ServerContract.from_env()
    user, api_url = os.environ.get("JUPYTERHUB_USER", ""), os.environ.get("JUPYTERHUB_API_URL", "")
    if not (contract.entry_key and contract.relay_mark and user and api_url
            and hasattr(serverapp.identity_provider, "hub_auth")):
        serverapp.log.warning("pdl entry gate: off (the hub told no key): strangers can tell this server runs")
        return
    parts = urlsplit(api_url)
    install(serverapp.web_app, EntryGate(serverapp.identity_provider, user, contract.entry_key, contract.relay_mark,
                                         f"{parts.scheme}://{parts.netloc}"))
    serverapp.log.info("pdl entry gate: strangers get the hub's answer for a stopped server")
