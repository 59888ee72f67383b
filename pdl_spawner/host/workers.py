"""What the kinds whose servers are host processes (the embedded default, Slurm) share
in their :class:`~pdl_spawner.core.worker_source.WorkerSource`: the server's key, where
the hub reaches its lease, and giving the workers back when the server stops.

A :class:`HostWorkers` is made with its :class:`~pdl_spawner.host.server.HostServer`
spawner. The server calls :meth:`HostWorkers.release` when it stops and
:meth:`HostWorkers.release_blocking` from ``clear_state`` (on the database thread).
"""

from __future__ import annotations

from abc import abstractmethod

from jupyterhub.utils import url_path_join

from pdl_spawner.core.worker_source import SpawnerWorkers


class HostWorkers(SpawnerWorkers):
    """A host server's source of workers; a kind adds where they come from."""

    @property
    def owner_key(self) -> str:
        """The user name, plus ``/server`` for named servers."""
        return self.spawner.owner

    def ready_to_start(self) -> bool:
        return bool(self.spawner.slots)

    def lease_url(self) -> str | None:
        spawner = self.spawner
        if spawner.server is None or not spawner.port:
            return None
        base = url_path_join(spawner.server.base_url, "pdl/api/lease")
        return f"http://{spawner.server_address}:{spawner.port}{base}"

    def lease_token(self) -> str | None:
        return self.spawner.api_token

    @abstractmethod
    async def release(self) -> None:
        """Give back this server's workers (the server has stopped, or its start failed)."""

    @abstractmethod
    def release_blocking(self) -> list[str]:
        """Give back whatever the cluster holds for this server, by owner (the server was
        found gone); blocks: it runs on the database thread. What was released."""
