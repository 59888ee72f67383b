"""The Cluster panel's HTTP API, under ``<base_url>/pdl/api/``; JSON in, JSON out.

- ``GET  /pdl/api/cluster``: the panel's model (:meth:`ClusterMonitor.snapshot_sync`);
- ``POST /pdl/api/stop``: interrupt the running distributed cell on every rank;
- ``POST /pdl/api/restart``: kill this cluster's engines so that they are restarted;
- ``POST /pdl/api/extend``: ask the hub for more time for the session (the panel's
  Extend): recorded in the lease as a :class:`~pdl.lease.ExtendWish`;
- ``GET  /pdl/api/lease``: this server's engine lease (:class:`pdl.lease.LeaseView`):
  ``{"released": ..., "want": ..., "grant": ...}``, each a message or null;
- ``POST /pdl/api/lease``: the hub's answer to a request for engines, a
  :class:`~pdl.lease.Grant` or a :class:`~pdl.lease.Refusal` (400, naming the valid
  shapes, for anything else); a grant of engines the hub started itself (Docker Swarm)
  also ends the release (before the answer, so that the hub's next look never finds
  the release it just answered); 404 outside a hub server;
- ``POST /pdl/api/lease/extension``: the hub's answer to a wish for more time, an
  :class:`~pdl.lease.Extended` or a :class:`~pdl.lease.Refusal`, which ends the wish;
- ``POST /pdl/api/lease/gpu-idle``: the hub's flag on GPUs held idle, a
  :class:`~pdl.lease.GpuIdle` (``since`` 0: lifted).

The hub reads and answers the lease this way, with the server's own API token, and
never touches the files; these calls are not user activity. The user may write here
too: nothing here is trusted by the hub (a grant of slots the ledger did not give opens
no GPU: the device cgroup follows the ledger).

Every handler requires an authenticated user (a Jupyter token or the login
cookie, plus the XSRF token for cookie-authenticated POSTs).

The hub looks at the lease about once a second: :func:`quiet_lease_polls` (installed by
:func:`setup_handlers`) logs those successful ``GET``s at debug level, so the server's log
(and the hub's, where a server writes to it) has no line per look unless debug is on.
"""

from __future__ import annotations

import json
import logging
import re

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from pdl.lease import SHAPES, Answer, ExtendAnswer, GpuIdle, Grant, LeaseFiles, LeaseFormatError, decode
from pdl_server import session_clock

from .monitor import ClusterMonitor

#: Key of the ClusterMonitor in the tornado application's settings.
SETTINGS_KEY = "pdl_cluster_monitor"


class _MonitorHandler(APIHandler):
    @property
    def monitor(self) -> ClusterMonitor:
        return self.settings[SETTINGS_KEY]

    def reply(self, body: dict) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class ClusterHandler(_MonitorHandler):
    @tornado.web.authenticated
    async def get(self):
        self.reply(await self.monitor.snapshot())


class StopHandler(_MonitorHandler):
    @tornado.web.authenticated
    async def post(self):
        self.reply(await self.monitor.stop_cell())


class RestartHandler(_MonitorHandler):
    @tornado.web.authenticated
    async def post(self):
        self.reply(await self.monitor.restart_engines())


class ExtendHandler(_MonitorHandler):
    @tornado.web.authenticated
    def post(self):
        self.reply(self.monitor.ask_extension())


class LeaseHandler(APIHandler):
    def update_api_activity(self):
        """The hub's looks at the lease are not the user's activity (idle culling)."""

    def _files(self) -> LeaseFiles:
        files = LeaseFiles.of_this_server()
        if files is None:
            raise tornado.web.HTTPError(404, "no engine lease outside a hub server")
        return files

    @tornado.web.authenticated
    def get(self):
        body = self._files().view().to_json()
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def _body(self, kind):
        """The request's body as a lease message of ``kind``; HTTP 400 (one line naming
        the valid shapes) for anything else."""
        try:
            return decode(kind, json.loads(self.request.body))
        except ValueError as e:  # not JSON, or LeaseFormatError
            why = str(e).splitlines()[0] if isinstance(e, LeaseFormatError) else "not JSON"
            raise tornado.web.HTTPError(400, f"{why}: the body must be one of {SHAPES}") from None

    @tornado.web.authenticated
    def post(self):
        files = self._files()
        answer = self._body(Answer)
        files.write(answer)
        if isinstance(answer, Grant) and answer.started_by_hub:
            files.release_answered()
        self.finish(json.dumps({"ok": True}))


class ExtensionHandler(LeaseHandler):
    """The hub's answer to a wish for more time (``POST /pdl/api/lease/extension``)."""

    @tornado.web.authenticated
    def get(self):
        raise tornado.web.HTTPError(405)

    @tornado.web.authenticated
    def post(self):
        files = self._files()
        files.answer_extension(self._body(ExtendAnswer))
        session_clock.forget_readings()  # the scheduler's end (Slurm's squeue) moved
        self.finish(json.dumps({"ok": True}))


class GpuIdleHandler(ExtensionHandler):
    """The hub's flag on GPUs held idle, or its lifting (``POST /pdl/api/lease/gpu-idle``)."""

    @tornado.web.authenticated
    def post(self):
        self._files().note_gpu_idle(self._body(GpuIdle))
        self.finish(json.dumps({"ok": True}))


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


def setup_handlers(web_app, monitor: ClusterMonitor) -> None:
    web_app.settings[SETTINGS_KEY] = monitor
    base = url_path_join(web_app.settings["base_url"], "pdl", "api")
    quiet_lease_polls(url_path_join(base, "lease"))
    web_app.add_handlers(".*$", [
        (url_path_join(base, "cluster"), ClusterHandler),
        (url_path_join(base, "stop"), StopHandler),
        (url_path_join(base, "restart"), RestartHandler),
        (url_path_join(base, "extend"), ExtendHandler),
        (url_path_join(base, "lease"), LeaseHandler),
        (url_path_join(base, "lease", "extension"), ExtensionHandler),
        (url_path_join(base, "lease", "gpu-idle"), GpuIdleHandler),
    ])
