"""The Cluster panel's HTTP API, under ``<base_url>/pdl/api/``; JSON in, JSON out.

- ``GET  /pdl/api/cluster``: the panel's model (:meth:`ClusterMonitor.snapshot_sync`);
- ``POST /pdl/api/stop``: interrupt the running distributed cell on every rank;
- ``POST /pdl/api/restart``: kill this cluster's engines so that they are restarted;
- ``GET  /pdl/api/lease``: this server's engine lease (:mod:`pdl_server.lease`):
  ``{"released": ..., "want": ..., "grant": ...}``, each the file's content or null;
- ``POST /pdl/api/lease``: the hub's answer to a request for engines (the body is
  written as the lease's grant: ``{"slots": [...]}`` on one machine, ``{"engines": n}``
  on Docker Swarm, or ``{"refused": one line}``); a grant of engines also ends the
  release (before the answer, so that the hub's next look never finds the release it
  just answered); 404 outside a hub server. The hub reads and answers the lease this
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

from pdl_server import lease as engine_lease

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

    def _directory(self):
        directory = engine_lease.lease_dir()
        if directory is None:
            raise tornado.web.HTTPError(404, "no engine lease outside a hub server")
        return directory

    @tornado.web.authenticated
    def get(self):
        directory = self._directory()
        body = {key: engine_lease.read(directory, name) for key, name in
                (("released", engine_lease.RELEASED), ("want", engine_lease.WANT), ("grant", engine_lease.GRANT))}
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    @tornado.web.authenticated
    def post(self):
        directory = self._directory()
        try:
            grant = json.loads(self.request.body)
        except ValueError:
            grant = None
        if not isinstance(grant, dict) or len({"slots", "engines", "refused"} & set(grant)) != 1:
            raise tornado.web.HTTPError(
                400, 'the body must be one of {"slots": [...]}, {"engines": n} or {"refused": "why"}')
        engine_lease.write(directory, engine_lease.GRANT, grant)
        if grant.get("engines"):
            engine_lease.remove(directory, engine_lease.RELEASED, engine_lease.WANT)
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
