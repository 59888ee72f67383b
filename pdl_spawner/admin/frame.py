"""The admin view's frame: what it shows of every cluster kind, and how it is served.

The admin view (``python -m pdl_spawner.admin.view``, :mod:`pdl_spawner.admin.view`)
is a JupyterHub managed service. Each cluster kind brings its source: a reader (the
status model, JSON-ready, read on every request) and the :class:`PageParts` that turn
it into HTML (its summary line and tables): :mod:`pdl_spawner.local.admin_source`,
:mod:`pdl_spawner.swarm.admin_source`, :mod:`pdl_spawner.slurm.admin_source`. This
module holds the rest: the rows every kind shares (times, durations, owners, the
queue and the reclaim log of :mod:`pdl_spawner.core`), the page around the tables,
and the hub-authenticated handlers:

- ``GET <prefix>``: the HTML page;
- ``GET <prefix>api/status``: the status model as JSON, for scripts
  (``Authorization: token ...`` with a hub API token).

Access is JupyterHub's: a request needs the scope
``access:services!service=pdl-admin``, which the admin role has (through
``access:services``) and ordinary users do not. Everyone else gets 403: the hub
refuses the OAuth login, or this service refuses the token.

The rows and the page are pure functions; the handlers run the reader (blocking I/O)
in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web

from pdl.process import die_with_parent
from pdl_spawner.core.reservations import Reclaim
from pdl_spawner.core.wait_queue import Waiter

#: How many reclaims the view lists, newest first.
RECENT_RECLAIMS = 20


@dataclass(frozen=True)
class PageParts:
    """What a cluster kind adds to the page: ``summary(status)`` gives the summary
    line's subject and what it says of the pool; ``sections(status)`` the HTML of its
    tables (every value escaped); ``unreadable``: what the page names when its source
    could not be read (the status's ``error``: "Docker", "Slurm")."""

    summary: Callable[[dict], tuple[str, str]]
    sections: Callable[[dict], str]
    unreadable: str = ""


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


def reservation_row(slot: str, node: str, owner: str, user: str, since: float, now: float) -> dict:
    """One reservation row: ``slot``, ``node``, ``owner``/``user``/``server``, ``since``
    (ISO UTC) and ``held_s`` (whole seconds held at ``now``; both epoch seconds)."""
    return {"slot": slot, "node": node, "owner": owner, "user": user, "server": split_owner(owner)[1],
            "since": iso_utc(since), "held_s": max(0, int(now - since))}


def queue_rows(waiters: list[Waiter], now: float) -> list[dict]:
    """One row per waiting spawn, head first: ``position`` (1 = next served of all),
    ``owner``/``user``/``server``, ``workers`` wanted, ``gpu_type`` ("" : any),
    ``since`` (ISO UTC) and ``waiting_s`` (whole seconds waited at ``now``, epoch seconds)."""
    return [
        {"position": i, "owner": w.owner, "user": w.user, "server": split_owner(w.owner)[1],
         "workers": w.wanted, "gpu_type": w.gpu_type, "since": iso_utc(w.since), "waiting_s": max(0, int(now - w.since))}
        for i, w in enumerate(waiters, start=1)
    ]


def typed(text, gpu_type: str) -> str:
    """``text`` with the GPU type after it, where there is one: ``"gpu:0 (a100)"``."""
    return f"{text} ({gpu_type})" if gpu_type else str(text)


def reclaim_rows(reclaims: list[Reclaim]) -> list[dict]:
    """One row per reclaim, as given (newest first): ``at`` (ISO UTC),
    ``owner``/``user``, the ``slots`` freed and the ``reason``."""
    return [
        {"at": iso_utc(r.at), "owner": r.owner, "user": split_owner(r.owner)[0],
         "slots": list(r.slots), "reason": r.reason}
        for r in reclaims
    ]


def table_html(caption: str, headers: list[str], rows: list[list[str]], empty: str) -> str:
    """An HTML table; every header and cell is escaped here."""
    if not rows:
        return f'<h2>{escape(caption)}</h2>\n<p class="empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<h2>{escape(caption)}</h2>\n<table>\n<tr>{head}</tr>\n{body}\n</table>"


def usage_section(status: dict) -> str:
    """The table of worker-hours per person this week and this month (the hub's usage
    report, :func:`pdl_spawner.hub.usage_book.summary_rows`), where the status has it;
    the one line saying why not where it could not be read."""
    if "usage_error" in status:
        return f'<h2>Worker-hours</h2>\n<p class="empty">{escape(status["usage_error"])}</p>'
    if "usage" not in status:
        return ""
    return table_html(
        "Worker-hours (UTC; pdl-usage prints them by day)",
        ["User", "GPU h this week", "GPU h this month", "CPU h this week", "CPU h this month"],
        [[r["user"], f"{r['gpu_week_h']:.2f}", f"{r['gpu_month_h']:.2f}", f"{r['cpu_week_h']:.2f}",
          f"{r['cpu_month_h']:.2f}"] for r in status["usage"]],
        "No worker was held this month.",
    )


def gpu_name(node: str, gpu: str) -> str:
    """A GPU of a cluster as the view names it: ``"<node>/<GPU>"``."""
    return f"{node}/{gpu}"


def holdings_sections(status: dict, unit: str, none_held: str, none_reclaimed: str) -> str:
    """The tables Reservations, Queue and Recent reclaims of a kind whose holdings are
    rows of :func:`reservation_row` (local slots, Swarm GPUs): ``unit`` names what is
    held ("Slot", "GPU"); ``none_held`` and ``none_reclaimed`` are what the empty
    Reservations and Recent reclaims tables say."""
    reservations = table_html(
        "Reservations", [unit, "Node", "User/server", "Since (UTC)", "Held for"],
        [[typed(r["slot"], r.get("gpu_type", "")), r["node"], r["owner"], r["since"], duration_text(r["held_s"])]
         for r in status["reservations"]],
        none_held,
    )
    queue = table_html(
        "Queue", ["Position", "User/server", "Workers wanted", "Waiting since (UTC)", "Waiting for"],
        [[q["position"], q["owner"], typed(q["workers"], q["gpu_type"]), q["since"], duration_text(q["waiting_s"])]
         for q in status["queue"]],
        "Nobody is waiting.",
    )
    reclaims = table_html(
        "Recent reclaims", ["When (UTC)", "User/server", f"{unit}s", "Reason"],
        [[r["at"], r["owner"], ", ".join(r["slots"]), r["reason"]] for r in status["reclaims"]],
        none_reclaimed,
    )
    return f"{reservations}\n{queue}\n{reclaims}"


def gpu_idle_rows(flags: dict[str, float], now: float) -> list[dict]:
    """One row per owner whose GPUs are flagged as held idle: ``owner``/``user``/``server``,
    ``since`` (ISO UTC) and ``idle_s``; ``flags`` maps owners to epoch seconds."""
    return [{"owner": owner, "user": split_owner(owner)[0], "server": split_owner(owner)[1], "since": iso_utc(since),
             "idle_s": max(0, int(now - since))} for owner, since in sorted(flags.items())]


def gpu_idle_section(status: dict) -> str:
    """The table "GPUs held idle" of a kind that reads GPU use (the embedded default)."""
    return table_html(
        "GPUs held idle (0 % use)", ["User/server", "Idle since (UTC)", "Idle for"],
        [[r["owner"], r["since"], duration_text(r["idle_s"])] for r in status.get("gpu_idle", [])],
        "No GPU is held idle.",
    )


def nodes_summary(status: dict) -> tuple[str, str]:
    """The summary of a kind with several nodes (``nodes``, ``unavailable``, ``pool`` and
    ``free`` of GPUs, maybe ``partition`` and ``other_services``): its subject (PDL's
    nodes) and what it says of the GPUs."""
    nodes = status["nodes"]
    subject = f"{'Node' if len(nodes) == 1 else 'Nodes'} {', '.join(nodes) or '(none)'}"
    if status.get("partition"):
        subject = f"Partition {status['partition']}, {subject[0].lower()}{subject[1:]}"
    if status["pool"] is None:
        return subject, "GPUs unknown"
    text = f"{len(status['free'])} of {len(status['pool'])} GPU(s) free"
    if status.get("other_services"):
        text += f", {len(status['other_services'])} held by other services"
    if status["unavailable"]:
        text += f"; not available: {', '.join(status['unavailable'])}"
    return subject, text


def render_page(status: dict, page: PageParts) -> str:
    """The admin page for a kind's status model: the summary line (and, when its source
    could not be read, why), then the kind's tables. Every value is HTML-escaped."""
    subject, summary = page.summary(status)
    error = ""
    if status.get("error"):
        error = f'\n<p class="error">{escape(page.unreadable)} could not be read: {escape(status["error"])}</p>'
    sections = page.sections(status) + "\n" + usage_section(status)
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
.error {{ color: #a00; }}
</style>
</head>
<body>
<h1>PDL admin view</h1>
<p class="summary">{escape(subject)}: {escape(summary)}. As of {escape(status["now"])}
(<a href="api/status">JSON</a>).</p>{error}
{sections}
</body>
</html>
"""


# -- I/O: the handlers ---------------------------------------------------------------


class _ViewHandler(HubOAuthenticated, web.RequestHandler):
    """Base of the view's handlers: hub-authenticated, runs the reader (blocking I/O)
    off the event loop."""

    def initialize(self, hub_auth: HubOAuth, reader: Callable[[], dict], page: PageParts):
        self.hub_auth = hub_auth
        self.reader = reader
        self.page = page

    async def status(self) -> dict:
        return await asyncio.to_thread(self.reader)

    def set_default_headers(self):
        self.set_header("Cache-Control", "no-store")


class PageHandler(_ViewHandler):
    """``GET <prefix>``: the HTML page. Without a login the browser is sent through
    the hub's OAuth; a user without access gets 403."""

    @web.authenticated
    async def get(self):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.finish(render_page(await self.status(), self.page))


class StatusAPIHandler(_ViewHandler):
    """``GET <prefix>api/status``: the status model as JSON. 403 (never a login
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


def make_app(prefix: str, reader: Callable[[], dict], page: PageParts, *, service_name: str) -> web.Application:
    """The tornado app, its routes under ``prefix`` (ending in ``/``); ``reader``
    returns the status model (blocking), ``page`` renders it. The hub
    connection (API URL, token, OAuth client) comes from the ``JUPYTERHUB_*``
    environment the hub gives its services."""
    hub_auth = HubOAuth(access_scopes={access_scope(service_name)}, cache_max_age=60)
    args = {"hub_auth": hub_auth, "reader": reader, "page": page}
    return web.Application(
        [
            (prefix, PageHandler, args),
            (url_path_join(prefix, "api/status"), StatusAPIHandler, args),
            (url_path_join(prefix, "oauth_callback"), _OAuthCallbackHandler, {"hub_auth": hub_auth}),
            (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        ],
        cookie_secret=os.urandom(32),
    )


async def _serve(reader: Callable[[], dict], page: PageParts) -> None:
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app = make_app(prefix, reader, page, service_name=os.environ["JUPYTERHUB_SERVICE_NAME"])
    app.listen(url.port, url.hostname)
    logging.getLogger("pdl.admin_view").info("PDL admin view at %s%s", url.netloc, prefix)
    await asyncio.Event().wait()


def serve(reader: Callable[[], dict], page: PageParts) -> None:
    """Serve the status ``reader`` returns, as ``page`` renders it, until the hub stops the service; never outlive the hub (even after ``kill -9``).
    Ctrl-C in the hub's terminal reaches this process too: it ends quietly, as the hub does."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    try:
        asyncio.run(_serve(reader, page))
    except KeyboardInterrupt:
        pass


