"""The hub's spawn routes, answered by PDL before JupyterHub prepares a spawn.

A spawn JupyterHub starts comes from its REST handler (``POST
/hub/api/users/<name>/server`` and ``.../servers/<server>``, through its
``spawn_single_user``) or its spawn page (the form, a spawn URL's query, through its
``_wrap_spawn_single_user``, which gives the spawn a second and then sends the browser
to the pending page). JupyterHub's own spawn then does its work on the hub's one event loop before the spawner's ``start()`` runs:
the server's database row, its API token and OAuth client, several commits; and after a
refused ``start()`` it undoes them and logs an error. In a burst of 20 requests at once
a refusal, which needs none of it, waited behind all of that work (0.9 s at p95).

:class:`AdmitBeforeSpawn` asks the spawner first (a PDL spawner's
:meth:`~pdl_spawner.core.spawner.SpawnerCore.admit_spawn`), after JupyterHub's handler
has authenticated the request, checked its scope and found the server not running:
a refusal (400 or 409, one line) is sent at once and JupyterHub's spawn never starts;
an admitted request goes on to JupyterHub's spawn as before, and its admission ends if
that fails before ``start()``. :func:`fit_spawn_routes` puts the fitted handlers in
place of JupyterHub's own, on the same routes, when the hub builds its route table,
with the way on to a running server, which carries an entry ticket, and the stranger's
answer at a user's origin where no server runs (:mod:`pdl_spawner.hub.server_entry`).
"""

from __future__ import annotations

import asyncio

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.handlers.base import UserUrlHandler
from jupyterhub.handlers.pages import SpawnHandler

from pdl_spawner.core.admission import ADMISSIONS, Admission
from pdl_spawner.hub.server_entry import PDLUserUrlHandler, fit_outside_prefix


#: Seconds PDL's answer may take before a spawn request goes on to JupyterHub's spawn
#: without it (within JupyterHub's slow_spawn_timeout, 10 s, after which it answers 202).
ANSWER_WITHIN_S = 5.0


class AdmitBeforeSpawn:
    """Mixin for a JupyterHub handler: a PDL spawner answers a spawn request first."""

    async def admit_first(self, user, server_name: str, options: dict | None) -> Admission | None:
        """The spawner's answer (:meth:`~pdl_spawner.core.spawner.SpawnerCore.admit_spawn`):
        HTTPError for a refusal, else its admission; None where the spawner is not PDL's or
        its server runs or is pending, and where the answer takes longer than
        :data:`ANSWER_WITHIN_S` (a cluster slow to say what is free): JupyterHub's spawn
        goes on, and ``start()`` answers, as it would without this."""
        spawner = user.spawners.get(server_name)
        admit = getattr(spawner, "admit_spawn", None)
        if admit is None or spawner.active:
            return None
        try:
            return await asyncio.wait_for(admit(options), ANSWER_WITHIN_S)
        except asyncio.TimeoutError:
            return None

    @staticmethod
    def end_admission(user, server_name: str, admission: Admission | None) -> None:
        """A request admitted failed before its ``start()`` took (or after: a no-op)."""
        if admission is not None:
            ADMISSIONS.drop(user.spawners[server_name].owner_key, admission)


class PDLUserServerAPIHandler(AdmitBeforeSpawn, UserServerAPIHandler):
    """JupyterHub's REST handler of a user's server, a PDL spawner answering spawns first."""

    async def spawn_single_user(self, user, server_name="", display_name="", options=None):
        admission = await self.admit_first(user, server_name, options)
        try:
            return await super().spawn_single_user(user, server_name, display_name, options=options)
        except BaseException:
            self.end_admission(user, server_name, admission)
            raise


class PDLSpawnHandler(AdmitBeforeSpawn, SpawnHandler):
    """JupyterHub's spawn page, a PDL spawner answering spawns first: before JupyterHub
    starts the spawn and gives it a second before it sends the browser to the pending
    page, so that a refusal, however long the answer takes, is the form again with its
    line (what JupyterHub's page does with a spawn's error)."""

    async def _wrap_spawn_single_user(self, user, server_name, display_name, spawner, pending_url, options=None):
        admission = await self.admit_first(user, server_name, options)
        try:
            return await super()._wrap_spawn_single_user(user, server_name, display_name, spawner, pending_url,
                                                         options)
        except BaseException:
            self.end_admission(user, server_name, admission)
            raise


#: JupyterHub's handler -> PDL's on the same routes.
FITTED = {UserServerAPIHandler: PDLUserServerAPIHandler, SpawnHandler: PDLSpawnHandler,
          UserUrlHandler: PDLUserUrlHandler}


def fitted_routes(routes: list) -> list:
    """``routes`` (tornado's ``(pattern, handler[, kwargs])``), changed in place and
    returned: each of JupyterHub's spawn handlers replaced by PDL's (:data:`FITTED`)."""
    for i, route in enumerate(routes):
        if len(route) > 1 and route[1] in FITTED:
            routes[i] = (route[0], FITTED[route[1]], *route[2:])
    return routes


def _fit(change) -> None:
    fitted_routes(change.new)


def fit_spawn_routes() -> bool:
    """In a running JupyterHub (this process's, while it loads its configuration): fit
    its spawn routes (:func:`fitted_routes`) when it builds its route table, and the routes
    outside ``/hub/`` (:func:`~pdl_spawner.hub.server_entry.fit_outside_prefix`). False where
    no hub runs in this process (a configuration only read, a test); nothing changes then."""
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return False
    JupyterHub.instance().observe(_fit, names="handlers")
    fit_outside_prefix()
    return True
