"""The engine lease's HTTP API, under ``<base_url>/pdl/api/lease``: a Jupyter server
extension of the user's server (enabled by ``etc/jupyter/jupyter_server_config.d/pdl.json``)
over its :class:`~pdl_server.lease_owner.LeaseOwner`. JSON in, JSON out; 404 outside a hub
server; a body of another shape: 400, in one line naming the valid shapes.

The hub (with the server's own API token; it never touches the files):

- ``GET  /pdl/api/lease``: the lease (:meth:`pdl.lease.LeaseView.to_json`); with
  ``?after=<version>&epoch=<epoch>&wait=<seconds>``, once it changed since that version,
  or after ``wait`` seconds (a long poll, at most :data:`pdl.lease.LONG_POLL_MAX_S`);
- ``POST /pdl/api/lease``: its answer to a request for engines, a
  :class:`~pdl.lease.Grant` or a :class:`~pdl.lease.Refusal`;
- ``POST /pdl/api/lease/extension``: its answer to a wish for more time, an
  :class:`~pdl.lease.Extended` or a :class:`~pdl.lease.Refusal`;
- ``POST /pdl/api/lease/gpu-idle``: its flag on GPUs held idle, a
  :class:`~pdl.lease.GpuIdle` (``since`` 0: lifted).

The supervisor (``pdl-singleuser``, with the same token):

- ``POST /pdl/api/lease/releasing``: ``{"idle_s": seconds or null}``, it is about to stop
  the engines: ``{"ok": true}``, or false where it must not
  (:meth:`~pdl_server.lease_owner.LeaseOwner.begin_release`);
- ``POST /pdl/api/lease/released``: the :class:`~pdl.lease.Release` it made, or ``{}``
  when it made none;
- ``POST /pdl/api/lease/held``: the grant it brought the engines back on.

A kernel (with the token its server passed on): ``POST /pdl/api/lease/cell-start``
(a distributed cell starts; answers the lease), ``POST /pdl/api/lease/want`` (a
:class:`~pdl.lease.Want`; answers the lease), ``POST /pdl/api/lease/forget`` (the
request ends; answers the lease).

The user may call any of these too: nothing here is trusted by the hub (a grant of
slots the ledger did not give opens no GPU: the device cgroup follows the ledger).
Every handler requires an authenticated user (a Jupyter token, or the login cookie
plus the XSRF token); none of these calls is the user's activity. The hub waits on the
lease in long polls: :func:`quiet_lease_polls` logs those successful ``GET``s at debug
level, so the server's log has no line per look unless debug is on.
"""

from __future__ import annotations

import json
import logging
import re

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from pdl.lease import (LONG_POLL_MAX_S, SHAPES, Answer, ExtendAnswer, GpuIdle, Grant, LeaseFormatError, Release,
                       Want, decode)
from pdl_server.lease_owner import LeaseOwner, this_servers_owner


class LeaseHandler(APIHandler):
    """``GET`` and ``POST /pdl/api/lease`` (see the module docstring)."""

    def update_api_activity(self):
        """Looks at the lease, by the hub, the supervisor or a kernel, are not the user's activity."""

    @property
    def owner(self) -> LeaseOwner:
        owner = this_servers_owner()
        if owner is None:
            raise tornado.web.HTTPError(404, "no engine lease outside a hub server")
        return owner

    def reply(self, body: dict) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def message(self, kind):
        """The request's body as a lease message of ``kind``; HTTP 400 (one line naming
        the valid shapes) for anything else."""
        try:
            return decode(kind, self.json_body())
        except LeaseFormatError as e:
            raise tornado.web.HTTPError(400, f"{str(e).splitlines()[0]}: the body must be one of {SHAPES}") from None

    def json_body(self):
        try:
            return json.loads(self.request.body or b"{}")
        except ValueError:
            raise tornado.web.HTTPError(400, f"not JSON: the body must be one of {SHAPES}") from None

    @tornado.web.authenticated
    async def get(self):
        owner = self.owner
        after = self.get_query_argument("after", None)
        if after is None:
            self.reply(owner.view().to_json())
            return
        try:
            version, wait_s = int(after), float(self.get_query_argument("wait", str(LONG_POLL_MAX_S)))
        except ValueError:
            raise tornado.web.HTTPError(400, "after must be a whole number (a version) and wait seconds") from None
        view = await owner.wait_for_change(version, self.get_query_argument("epoch", ""), wait_s)
        self.reply(view.to_json())

    @tornado.web.authenticated
    def post(self):
        self.owner.answer_request(self.message(Answer))
        self.reply({"ok": True})


class _PostOnly(LeaseHandler):
    @tornado.web.authenticated
    async def get(self):
        raise tornado.web.HTTPError(405)


class ExtensionHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        self.owner.answer_extension(self.message(ExtendAnswer))
        self.reply({"ok": True})


class GpuIdleHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        self.owner.flag_gpu_idle(self.message(GpuIdle))
        self.reply({"ok": True})


class ReleasingHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        body = self.json_body()
        idle_s = body.get("idle_s") if isinstance(body, dict) else None
        if isinstance(idle_s, bool) or not (idle_s is None or isinstance(idle_s, (int, float))):
            raise tornado.web.HTTPError(400, f"idle_s must be seconds or null, got {idle_s!r}")
        self.reply({"ok": self.owner.begin_release(idle_s)})


class ReleasedHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        self.owner.end_release(None if self.json_body() == {} else self.message(Release))
        self.reply({"ok": True})


class HeldHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        self.owner.take_up(self.message(Grant))
        self.reply({"ok": True})


class CellStartHandler(_PostOnly):
    @tornado.web.authenticated
    async def post(self):
        self.reply((await self.owner.cell_start()).to_json())


class WantHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        self.owner.ask_again(self.message(Want))
        self.reply(self.owner.view().to_json())


class ForgetHandler(_PostOnly):
    @tornado.web.authenticated
    def post(self):
        self.owner.forget_request()
        self.reply(self.owner.view().to_json())


#: An access-log line: ``"<status> <METHOD> <uri>..."`` (JupyterHub's and jupyter_server's).
_ACCESS_LINE = re.compile(r"(\d{3}) ([A-Z]+) (\S+)")


class LeasePollsAtDebug(logging.Filter):
    """On the ``tornado.access`` logger: a successful (status < 400) ``GET`` of
    ``lease_path`` becomes a DEBUG record, dropped unless that logger shows DEBUG; every
    other record passes unchanged."""

    def __init__(self, lease_path: str, logger: logging.Logger):
        super().__init__()
        self.lease_path = lease_path
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        line = _ACCESS_LINE.match(record.getMessage())
        if not line or line[2] != "GET" or int(line[1]) >= 400 or line[3].split("?")[0] != self.lease_path:
            return True
        if not self.logger.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


def quiet_lease_polls(lease_path: str) -> LeasePollsAtDebug:
    """Install :class:`LeasePollsAtDebug` for ``lease_path`` (the URL path, base URL
    included) on the ``tornado.access`` logger, once: a second call returns the filter
    already there."""
    logger = logging.getLogger("tornado.access")
    for present in logger.filters:
        if isinstance(present, LeasePollsAtDebug) and present.lease_path == lease_path:
            return present
    installed = LeasePollsAtDebug(lease_path, logger)
    logger.addFilter(installed)
    return installed


#: Each handler's path under ``<base_url>/pdl/api/lease``.
ROUTES = (("", LeaseHandler), ("extension", ExtensionHandler), ("gpu-idle", GpuIdleHandler),
          ("releasing", ReleasingHandler), ("released", ReleasedHandler), ("held", HeldHandler),
          ("cell-start", CellStartHandler), ("want", WantHandler), ("forget", ForgetHandler))


def setup_handlers(web_app) -> None:
    base = url_path_join(web_app.settings["base_url"], "pdl", "api", "lease")
    quiet_lease_polls(base)
    web_app.add_handlers(".*$", [(url_path_join(base, part) if part else base, handler) for part, handler in ROUTES])


def _load_jupyter_server_extension(serverapp) -> None:
    setup_handlers(serverapp.web_app)
    held = "this hub server's" if this_servers_owner() is not None else "none: not a hub server"
    serverapp.log.info(f"pdl_server: engine lease API at /pdl/api/lease ({held})")
