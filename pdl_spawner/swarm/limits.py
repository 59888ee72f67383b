"""What each of a user's containers may take on the swarm: memory, CPUs and processes.

The notebook container (the Jupyter server, the user's kernels and controller) gets
JupyterHub's own ``mem_limit`` and ``cpu_limit``; each engine container gets
:attr:`SwarmLimits.engine_mem_limit` (default: ``mem_limit``) and
:attr:`SwarmLimits.engine_cpu_limit` cores, which Swarm also reserves, so that it places
an engine only where those cores are not promised to another; every container gets at
most ``process_limit`` processes and threads (:class:`~pdl_spawner.core.spawner.SpawnerCore`).
Docker enforces them with each container's own cgroups (:class:`~pdl_spawner.swarm.specs.Limits`):
past the memory, the kernel's OOM killer ends a process of that container; past the
processes, ``fork()`` fails there; past the CPUs, it waits. Other users' containers and
the hub go on.
"""

from __future__ import annotations

from jupyterhub.traitlets import ByteSpecification
from traitlets import Float, validate
from traitlets.config import LoggingConfigurable

from pdl_spawner.swarm.specs import Limits


class SwarmLimits(LoggingConfigurable):
    """Mixin of :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`: each container's limits."""

    engine_mem_limit = ByteSpecification(
        None, allow_none=True, config=True,
        help="""Memory each engine container may use (bytes, or with a K, M, G or T suffix);
        None: the server's `mem_limit`, and none if that is not set either.""",
    )

    engine_cpu_limit = Float(
        0.0, config=True,
        help="""Cores each engine container may use, reserved for it on its node (Swarm
        places an engine only where that many cores are not reserved by other tasks);
        0: no limit and no reservation.""",
    )

    @validate("engine_cpu_limit")
    def _validate_engine_cpu_limit(self, proposal):
        if proposal.value < 0:
            raise ValueError(f"engine_cpu_limit must be 0 (none) or a number of cores, got {proposal.value}")
        return proposal.value

    def notebook_limits(self) -> Limits:
        """The notebook container's: ``mem_limit``, ``cpu_limit`` and ``process_limit``."""
        return Limits(memory_bytes=self.mem_limit or 0, cpus=self.cpu_limit or 0.0, processes=self.process_limit)

    def engine_limits(self) -> Limits:
        """Each engine container's: ``engine_mem_limit``, ``engine_cpu_limit`` and ``process_limit``."""
        memory = self.engine_mem_limit if self.engine_mem_limit is not None else self.mem_limit
        return Limits(memory_bytes=memory or 0, cpus=self.engine_cpu_limit, processes=self.process_limit)
