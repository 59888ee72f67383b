"""The Cluster panel's HTTP API, under ``<base_url>/pdl/api/``; JSON in, JSON out.

- ``GET  /pdl/api/cluster``: the panel's model (:meth:`ClusterMonitor.snapshot_sync`);
- ``POST /pdl/api/stop``: interrupt the running distributed cell on every rank;
- ``POST /pdl/api/restart``: kill this cluster's engines so that they are restarted;
- ``GET  /pdl/api/lease``: this server's engine lease (:class:`pdl.lease.LeaseView`):
  ``{"released": ..., "want": ..., "grant": ...}``, each a message or null;
- ``POST /pdl/api/lease``: the hub's answer to a request for engines, a
  :class:`~pdl.lease.Grant` or a :class:`~pdl.lease.Refusal` (400, naming the valid
  shapes, for anything else); a grant of engines the hub started itself (Docker Swarm)
  also ends the release (before the answer, so that the hub's next look never finds
  the release it just answered); 404 outside a hub server. The hub reads and answers the lease this
  way, with the server's own API token, and never touches the files; these calls are
  not user activity. The user may write here too: nothing here is trusted by the hub
  (a grant of slots the ledger did not give opens no GPU: the device cgroup follows
  the ledger).

Every handler requires an authenticated user (a Jupyter token or the login
cookie, plus the XSRF token for cookie-authenticated POSTs).
"""

from __future__ import annotations

import json

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from pdl.lease import Answer, Grant, LeaseFiles, LeaseFormatError, decode

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

    @tornado.web.authenticated
    def post(self):
        files = self._files()
        try:
            answer = decode(Answer, json.loads(self.request.body))
        except ValueError as e:  # not JSON, or LeaseFormatError
            why = str(e).splitlines()[0] if isinstance(e, LeaseFormatError) else "not JSON"
            raise tornado.web.HTTPError(
                400, f'{why}: the body must be {{"workers": n, "slots": [...], "slurm_job": n}} or {{"refused": "why"}}')
        files.write(answer)
        if isinstance(answer, Grant) and answer.started_by_hub:
            files.release_answered()
        self.finish(json.dumps({"ok": True}))


def setup_handlers(web_app, monitor: ClusterMonitor) -> None:
    web_app.settings[SETTINGS_KEY] = monitor
    base = url_path_join(web_app.settings["base_url"], "pdl", "api")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "cluster"), ClusterHandler),
        (url_path_join(base, "stop"), StopHandler),
        (url_path_join(base, "restart"), RestartHandler),
        (url_path_join(base, "lease"), LeaseHandler),
    ])
