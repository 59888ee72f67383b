"""The admin view: who holds which slot, who waits in the queue, what was reclaimed.

A JupyterHub managed service, ``pdl-admin`` (registered in ``jupyterhub_config.py``
for the embedded default), run by the hub as ``python -m pdl_spawner.admin_view``.
Under its prefix (``$JUPYTERHUB_SERVICE_PREFIX``, ``/services/pdl-admin/``) it serves

- ``GET <prefix>``: an HTML page with three tables (reservations, queue, recent
  reclaims);
- ``GET <prefix>api/status``: the same as JSON, for scripts (``Authorization: token ...``
  with a hub API token); see :func:`status_model` for the fields.

Access is JupyterHub's: a request needs the scope
``access:services!service=pdl-admin``, which the admin role has (through
``access:services``) and ordinary users do not. Everyone else gets 403: the hub
refuses the OAuth login, or this service refuses the token.

Environment (set in the service definition):

- ``PDL_RESERVATIONS_DB``: the ledger file, the same as
  ``c.PDLLocalSpawner.reservations_db`` (required); the queue lives in it too;
- ``PDL_POOL``: the spawner's slots, comma-separated, when configured; otherwise
  the spawner's default pool (:func:`pdl.slots.default_pool`, with ``PDL_CPU_SLOTS``);
- ``PDL_ADMIN_VIEW_PORT`` (read by ``jupyterhub_config.py``, not here): the port on
  127.0.0.1 in the service's URL, default 8002. The service listens where
  ``$JUPYTERHUB_SERVICE_URL`` says.

The rows and the page are pure functions (:func:`status_model`, :func:`render_page`);
the handlers only read the ledger and call them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from pdl.engine_boot import die_with_parent
from pdl.slots import DEFAULT_CPU_SLOTS, default_pool, slot_index

from .reservations import Holding, Reclaim, SlotLedger
from .wait_queue import Waiter, WaitQueue

#: How many reclaims the view lists, newest first.
RECENT_RECLAIMS = 20

# -- pure: rows and page ------------------------------------------------------------


def iso_utc(epoch_s: float) -> str:
    """``epoch_s`` (seconds since the epoch) as ISO 8601 in UTC, to the second:
    ``"2025-01-31T09:05:00Z"``."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_text(seconds: float) -> str:
    """A duration in seconds, short: ``"42 s"``, ``"3 min 20 s"``, ``"2 h 5 min"``, ``"1 d 3 h"``."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {s} s"
    return f"{s} s"


def split_owner(owner: str) -> tuple[str, str]:
    """A ledger owner (``"user"`` or ``"user/server"``) as (user, server name; ``""`` for the default server)."""
    user, _, server = owner.partition("/")
    return user, server


def reservation_rows(holdings: list[Holding], node: str, now: float) -> list[dict]:
    """One row per reserved slot, in slot order: ``slot``, ``node`` (the machine the
    slot is on), ``owner``/``user``/``server``, ``since`` (ISO UTC) and ``held_s``
    (whole seconds held at ``now``, epoch seconds)."""
    ordered = sorted(holdings, key=lambda h: (h.slot.partition(":")[0], slot_index(h.slot), h.slot))
    return [
        {"slot": h.slot, "node": node, "owner": h.owner, "user": split_owner(h.owner)[0],
         "server": split_owner(h.owner)[1], "since": iso_utc(h.since), "held_s": max(0, int(now - h.since))}
        for h in ordered
    ]


def queue_rows(waiters: list[Waiter], now: float) -> list[dict]:
    """One row per waiting spawn, head first: ``position`` (1 = next served),
    ``owner``/``user``/``server``, ``workers`` wanted, ``since`` (ISO UTC) and
    ``waiting_s`` (whole seconds waited at ``now``, epoch seconds)."""
    return [
        {"position": i, "owner": w.owner, "user": w.user, "server": split_owner(w.owner)[1],
         "workers": w.wanted, "since": iso_utc(w.since), "waiting_s": max(0, int(now - w.since))}
        for i, w in enumerate(waiters, start=1)
    ]


def reclaim_rows(reclaims: list[Reclaim]) -> list[dict]:
    """One row per reclaim, as given (newest first): ``at`` (ISO UTC),
    ``owner``/``user``, the ``slots`` freed and the ``reason``."""
    return [
        {"at": iso_utc(r.at), "owner": r.owner, "user": split_owner(r.owner)[0],
         "slots": list(r.slots), "reason": r.reason}
        for r in reclaims
    ]


def status_model(
    holdings: list[Holding], waiters: list[Waiter], reclaims: list[Reclaim], *,
    node: str, pool: list[str] | None, now: float,
) -> dict:
    """Everything the view shows, JSON-ready: ``node`` (this machine's hostname),
    ``now`` (ISO UTC), ``pool`` and ``free`` (slot names; None when the pool is not
    known), and the rows of :func:`reservation_rows`, :func:`queue_rows` and
    :func:`reclaim_rows` as ``reservations``, ``queue`` and ``reclaims``.
    ``now`` is epoch seconds."""
    held = {h.slot for h in holdings}
    return {
        "node": node,
        "now": iso_utc(now),
        "pool": list(pool) if pool is not None else None,
        "free": [s for s in pool if s not in held] if pool is not None else None,
        "reservations": reservation_rows(holdings, node, now),
        "queue": queue_rows(waiters, now),
        "reclaims": reclaim_rows(reclaims),
    }


def _table(caption: str, headers: list[str], rows: list[list[str]], empty: str) -> str:
    """An HTML table; every header and cell is escaped here."""
    if not rows:
        return f'<h2>{escape(caption)}</h2>\n<p class="empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h2>{escape(caption)}</h2>\n<table>\n<tr>{head}</tr>\n{body}\n</table>"


def render_page(status: dict) -> str:
    """The admin page for a :func:`status_model` dict: a summary line and the tables
    Reservations, Queue and Recent reclaims (each says so when empty). Every value is
    HTML-escaped."""
    if status["pool"] is None:
        summary = f"{len(status['reservations'])} slot(s) reserved"
    else:
        summary = f"{len(status['free'])} of {len(status['pool'])} slot(s) free"
    reservations = _table(
        "Reservations", ["Slot", "Node", "User/server", "Since (UTC)", "Held for"],
        [[r["slot"], r["node"], r["owner"], r["since"], duration_text(r["held_s"])] for r in status["reservations"]],
        "No slot is reserved.",
    )
    queue = _table(
        "Queue", ["Position", "User/server", "Workers wanted", "Waiting since (UTC)", "Waiting for"],
        [[q["position"], q["owner"], q["workers"], q["since"], duration_text(q["waiting_s"])]
         for q in status["queue"]],
        "Nobody is waiting.",
    )
    reclaims = _table(
        "Recent reclaims", ["When (UTC)", "User/server", "Slots", "Reason"],
        [[r["at"], r["owner"], ", ".join(r["slots"]), r["reason"]] for r in status["reclaims"]],
        "No slot was reclaimed.",
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>PDL admin view</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }}
th {{ background: #f3f3f3; }}
.empty {{ color: #666; }}
</style>
</head>
<body>
<h1>PDL admin view</h1>
<p class="summary">Node {escape(status["node"])}: {escape(summary)}. As of {escape(status["now"])}
(<a href="api/status">JSON</a>).</p>
{reservations}
{queue}
{reclaims}
</body>
</html>
"""


# -- I/O: the ledger and the handlers -------------------------------------------------


def read_status(db_path: str | Path, *, node: str, pool: list[str] | None) -> dict:
    """:func:`status_model` for the ledger (and queue) file ``db_path``, now."""
    ledger = SlotLedger(db_path)
    return status_model(
        ledger.holdings(), WaitQueue(db_path).waiters(), ledger.reclaims(RECENT_RECLAIMS),
        node=node, pool=pool, now=time.time(),
    )


class _ViewHandler(HubOAuthenticated, web.RequestHandler):
    """Base of the view's handlers: hub-authenticated, reads the ledger off the event loop."""

    def initialize(self, hub_auth: HubOAuth, db_path: str, node: str, pool: list[str] | None):
        self.hub_auth = hub_auth
        self.db_path, self.node, self.pool = db_path, node, pool

    async def status(self) -> dict:
        return await asyncio.to_thread(read_status, self.db_path, node=self.node, pool=self.pool)

    def set_default_headers(self):
        self.set_header("Cache-Control", "no-store")


class PageHandler(_ViewHandler):
    """``GET <prefix>``: the HTML page. Without a login the browser is sent through
    the hub's OAuth; a user without access gets 403."""

    @web.authenticated
    async def get(self):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.finish(render_page(await self.status()))


class StatusAPIHandler(_ViewHandler):
    """``GET <prefix>api/status``: :func:`status_model` as JSON. 403 (never a login
    redirect) without a token or cookie that has access."""

    def get_login_url(self):
        raise web.HTTPError(403)

    @web.authenticated
    async def get(self):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(await self.status()))

    def write_error(self, status_code, **kwargs):
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": self._reason}))


class _OAuthCallbackHandler(HubOAuthCallbackHandler):
    """``GET <prefix>oauth_callback``: finishes the hub's OAuth login (sets this service's cookie)."""

    def initialize(self, hub_auth: HubOAuth):
        self.hub_auth = hub_auth


def access_scope(service_name: str) -> str:
    """The scope a request needs: access to this service (the admin role has it)."""
    return f"access:services!service={service_name}"


def make_app(prefix: str, db_path: str, *, node: str, pool: list[str] | None, service_name: str) -> web.Application:
    """The tornado app, its routes under ``prefix`` (ending in ``/``). The hub
    connection (API URL, token, OAuth client) comes from the ``JUPYTERHUB_*``
    environment the hub gives its services."""
    hub_auth = HubOAuth(access_scopes={access_scope(service_name)}, cache_max_age=60)
    args = {"hub_auth": hub_auth, "db_path": db_path, "node": node, "pool": pool}
    return web.Application(
        [
            (prefix, PageHandler, args),
            (url_path_join(prefix, "api/status"), StatusAPIHandler, args),
            (url_path_join(prefix, "oauth_callback"), _OAuthCallbackHandler, {"hub_auth": hub_auth}),
            (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        ],
        cookie_secret=os.urandom(32),
    )


def pool_from_env(env=os.environ) -> list[str]:
    """The spawner's pool: ``PDL_POOL`` (comma-separated) when the hub configured one,
    else the spawner's default (every GPU, else ``PDL_CPU_SLOTS`` CPU slots)."""
    if env.get("PDL_POOL"):
        return [s.strip() for s in env["PDL_POOL"].split(",") if s.strip()]
    return default_pool(int(env.get("PDL_CPU_SLOTS", DEFAULT_CPU_SLOTS)))


async def _serve() -> None:
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app = make_app(prefix, os.environ["PDL_RESERVATIONS_DB"], node=socket.gethostname(),
                   pool=pool_from_env(), service_name=os.environ["JUPYTERHUB_SERVICE_NAME"])
    app.listen(url.port, url.hostname)
    logging.getLogger("pdl.admin_view").info("PDL admin view at %s%s", url.netloc, prefix)
    await asyncio.Event().wait()


def main() -> None:
    """Serve until the hub stops the service; never outlive the hub (even after ``kill -9``)."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
