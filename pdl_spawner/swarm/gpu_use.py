"""GPUs held idle on Docker Swarm: the hub's reading of the use of the GPUs a server's
engines hold (:meth:`SwarmGpuUse.gpu_readings`, which the kind's source of workers,
:class:`~pdl_spawner.swarm.workers.SwarmGpus`, matches to a server's GPUs for
:mod:`pdl_spawner.core.gpu_idle`).

The GPUs are on the swarm's nodes, which the hub reaches only through the manager. So
the hub runs one global service of its own, :data:`~pdl_spawner.swarm.specs.GPU_READER`
(:func:`~pdl_spawner.swarm.specs.gpu_reader_service`; made on first need and kept, as
the network keeper is): on every node ``nvidia-smi`` prints each GPU's UUID, use and
memory every ``gpu_sample_s`` seconds, and the hub reads the latest lines through the manager
(``docker service logs``). A line names its GPU by UUID, as a node's
``node-generic-resources`` name it (``NVIDIA-GPU=GPU-<uuid>``): that is how a reading
meets the GPU Swarm assigned to an engine's task (:func:`~pdl_spawner.swarm.gpus.gpu_holdings`).
A node that declares its GPUs only by count names none, so its GPUs get no reading and
are never flagged.

Nothing of a user's takes part: the service is the hub's, in the admin's image
(``gpu_reader_image``), as ``run_as``, with no network; no user can write its output.
"""

from __future__ import annotations

import time

from docker.errors import APIError, NotFound
from traitlets import HasTraits, List, Unicode

from pdl_spawner.core.usage import GpuReading, gpu_reading
from pdl_spawner.swarm.gpus import PENDING
from pdl_spawner.swarm.specs import GPU_READER, gpu_reader_service

#: How many of the reader's intervals back a reading may come from.
FRESH_INTERVALS = 3


def parse_readings(text: str) -> dict[str, GpuReading]:
    """GPU UUID -> reading from the reader's output, ``"GPU-<uuid>, 37, 1024, 81920"`` per
    line (use in percent, memory in use and in all in MiB; a line of use alone is a reading
    without memory), the last line of each GPU winning; lines that are not that shape
    (``[N/A]``, a message of nvidia-smi's) are left out."""
    found: dict[str, GpuReading] = {}
    for line in text.splitlines():
        uuid, *values = [v.strip() for v in line.split(",")]
        reading = gpu_reading(values)
        if uuid and reading is not None:
            found[uuid] = reading
    return found


def held_readings(held: list[str], readings: dict[str, GpuReading]) -> list[GpuReading] | None:
    """The reading of each GPU of ``held`` (their ids), or None when any has no reading (or
    is not placed yet)."""
    if not held or any(gpu == PENDING or gpu not in readings for gpu in held):
        return None
    return [readings[gpu] for gpu in held]


class SwarmGpuUse(HasTraits):
    """Mixin of :class:`~pdl_spawner.swarm.spawner.PDLSwarmSpawner`: the GPU reader and
    its readings (see the module docstring). The spawner provides ``docker``,
    ``run_as``, ``image``, ``engine_image``, ``nvidia_smi`` and ``gpu_sample_s``."""

    gpu_reader_image = Unicode(
        "", config=True,
        help="""Image of the GPU reader (with gpu_idle_flag_s): one task on every node runs
        nvidia-smi in it (the NVIDIA runtime provides it). Empty: the engines' image.""",
    )

    gpu_reader_mounts = List(
        config=True,
        help="""Mounts of the GPU reader's containers, as the Engine API writes them (e.g. a
        driver folder where the NVIDIA runtime does not provide nvidia-smi); none by default.""",
    )

    #: The hub's last reading, shared by its spawners: (epoch s, UUID -> reading).
    _readings: tuple[float, dict[str, GpuReading]] = (0.0, {})

    async def gpu_readings(self) -> dict[str, GpuReading]:
        """UUID -> reading (use, memory) of every GPU the reader printed lately (a reading at most half a
        sample old is reused by every spawner of this hub); makes the reader when it is
        missing, which then has nothing to say for a few seconds."""
        now = time.time()
        at, readings = SwarmGpuUse._readings
        if now - at < self.gpu_sample_s / 2:
            return readings
        every_s = max(1, round(self.gpu_sample_s))
        try:
            reader = await self.ensure_gpu_reader(every_s)
            logs = await self.docker("service_logs", reader, stdout=True,
                                     since=int(now - FRESH_INTERVALS * every_s - 1))
        except (APIError, NotFound) as e:
            self.log.warning("Cannot read the GPUs' use on the swarm: %s", e)
            return {}
        text = logs.decode(errors="replace") if isinstance(logs, bytes) else b"".join(logs).decode(errors="replace")
        readings = parse_readings(text)
        SwarmGpuUse._readings = (now, readings)
        return readings

    async def ensure_gpu_reader(self, every_s: int) -> str:
        """The reader service's id, made (or brought up to the spec) when needed."""
        spec = gpu_reader_service(image=self.gpu_reader_image or self.engine_image or self.image,
                                  nvidia_smi=self.nvidia_smi or "nvidia-smi", every_s=every_s, user=self.run_as,
                                  mounts=self.gpu_reader_mounts)
        found = [s for s in await self.docker("services", filters={"name": GPU_READER})
                 if s["Spec"]["Name"] == GPU_READER]
        if not found:
            self.log.info("Starting the GPU reader %s on every node", GPU_READER)
            return (await self.docker("create_service", **spec))["ID"]
        current = found[0]
        if current["Spec"]["TaskTemplate"]["ContainerSpec"]["Command"] != \
                spec["task_template"]["ContainerSpec"]["Command"]:
            await self.docker("update_service", current["ID"], version=current["Version"]["Index"],
                              task_template=spec["task_template"], name=spec["name"], labels=spec["labels"],
                              mode=spec["mode"], endpoint_spec=spec["endpoint_spec"])
        return current["ID"]
