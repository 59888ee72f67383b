"""Where a Swarm user's files live: the admin's storage settings and the mounts they make.

:class:`SwarmStorage` is a mixin of :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`: its
settings (``home_storage``, ``data_storage``, ``cache_volume``, ...) are checked when
set, and :meth:`SwarmStorage.storage_mounts` gives the mounts of the notebook and every
engine (the same in all), built by :class:`pdl_spawner.swarm.specs.Storage`. A setting
that cannot work fails a spawn with HTTP 500 naming it, before any Docker call.
"""

from __future__ import annotations

from tornado import web
from traitlets import Dict, HasTraits, Unicode, Union, validate

from pdl_spawner.swarm import specs as swarm_specs


class SwarmStorage(HasTraits):
    """Mixin: each user's home, the dataset and the cache volume (see the module docstring).

    The spawner provides ``escaped_name`` (the user's name, escaped for Docker),
    ``container_home`` and ``mounts`` (dockerspawner's mounts of ``volumes``).
    """

    home_storage = Unicode(
        "volume", config=True,
        help="""How each user's home (`container_home`, in the notebook and every engine) is kept.
        "volume": the Docker named volume `pdl-home-{username}` of `home_volume_driver`. With the
        default local driver and no options it is a folder on the node the task runs on: it
        survives server restarts on that node, but not a move to another node (and engines on
        other nodes see their own). With a shared driver or NFS options it follows the user.
        "path": a bind mount of `home_path_template`, a folder every node mounts from shared
        storage (NFS at the same path on every node); the admin creates it, owned by `run_as`.""",
    )

    home_volume_driver = Unicode(
        "local", config=True,
        help="Docker volume driver of the home volume (`home_storage = \"volume\"`), on every node.",
    )

    home_volume_driver_opts = Dict(
        value_trait=Unicode(), config=True,
        help="""Options of the home volume's driver; `{username}` is filled in. NFS with the local
        driver: {"type": "nfs", "o": "addr=10.0.0.5,rw,nfsvers=4", "device": ":/export/home/{username}"}.
        Docker keeps a volume's options from its first use on each node.""",
    )

    home_path_template = Unicode(
        "", config=True,
        help="""Host folder of each user's home when `home_storage = "path"`, e.g.
        `/srv/pdl/home/{username}` ({username}: the escaped user name). The same on every
        node (shared storage). A missing folder fails the spawn naming it.""",
    )

    data_storage = Union(
        [Dict()], default_value=None, allow_none=True, config=True,
        help="""The dataset, mounted read-only at /data in the notebook and every engine
        (`CINIC10_DIR=/data/cinic10` unless `environment` sets it). None: no dataset.
        {"kind": "path", "source": "/srv/pdl/data"}: that host folder on each node.
        {"kind": "nfs", "addr": "10.0.0.5", "export": "/export/data"} (optional "options",
        e.g. "nfsvers=4"): an NFS export, mounted by each node.""",
    )

    cache_volume = Unicode(
        "pdl-cache-{username}", config=True,
        help="""Node-local volume (driver local: one per node) at /var/tmp in the notebook and
        every engine, where datasets are staged once per node (`CINIC10_CACHE=/var/tmp/cinic10`
        unless `environment` sets it): a user's ranks on one node share it. One per user by
        default: every user's containers run as the same `run_as`, so in a volume shared by
        all ("pdl-cache") any user could alter what the others load. "": no cache volume.""",
    )

    @validate("home_storage")
    def _validate_home_storage(self, proposal):
        return swarm_specs.check_home_kind(proposal.value)

    @validate("home_path_template")
    def _validate_home_path_template(self, proposal):
        return swarm_specs.check_home_path_template(proposal.value)

    @validate("data_storage")
    def _validate_data_storage(self, proposal):
        return swarm_specs.check_data(proposal.value)

    @validate("cache_volume")
    def _validate_cache_volume(self, proposal):
        return swarm_specs.check_volume_template(proposal.value, "cache_volume")

    @property
    def storage(self) -> swarm_specs.Storage:
        return swarm_specs.Storage(
            home=self.home_storage, home_volume_driver=self.home_volume_driver,
            home_volume_driver_opts=dict(self.home_volume_driver_opts), home_path_template=self.home_path_template,
            data=self.data_storage, cache_volume=self.cache_volume,
        )

    def storage_mounts(self) -> list[dict]:
        """This user's storage mounts, then those of ``volumes``; HTTP 500 naming a bad setting."""
        try:
            return swarm_specs.check_mounts([*self.storage.mounts(self.escaped_name, self.container_home),
                                             *self.mounts])
        except ValueError as e:
            message = f"PDLSwarmSpawner storage: {e}"
            raise web.HTTPError(500, message, reason=message) from None
