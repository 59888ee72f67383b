"""The Cluster panel's HTTP API, under ``<base_url>/pdl/api/``; JSON in, JSON out.

- ``GET  /pdl/api/cluster``: the panel's model (:meth:`ClusterMonitor.snapshot_sync`);
- ``POST /pdl/api/stop``: interrupt the running distributed cell on every rank;
- ``POST /pdl/api/restart``: kill this cluster's engines so that they are restarted;
- ``POST /pdl/api/extend``: ask the hub for more time for the session (the panel's
  Extend): recorded in the lease as a :class:`~pdl.lease.ExtendWish`.

The engine lease's API, through which the hub, the supervisor and kernels reach the
lease, is the user's server's own (:mod:`pdl_server.lease_api`).

Every handler requires an authenticated user (a Jupyter token or the login
cookie, plus the XSRF token for cookie-authenticated POSTs).
"""

from __future__ import annotations

import json

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

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


def setup_handlers(web_app, monitor: ClusterMonitor) -> None:
    web_app.settings[SETTINGS_KEY] = monitor
    base = url_path_join(web_app.settings["base_url"], "pdl", "api")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "cluster"), ClusterHandler),
        (url_path_join(base, "stop"), StopHandler),
        (url_path_join(base, "restart"), RestartHandler),
        (url_path_join(base, "extend"), ExtendHandler),
    ])
