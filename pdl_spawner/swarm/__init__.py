"""Docker Swarm: each user's server and GPU engines as Swarm services.

- :mod:`pdl_spawner.swarm.spawner`: :class:`PDLSwarmSpawner` (entry point ``pdl-swarm``,
  the services' life), its source of workers :mod:`pdl_spawner.swarm.workers` (the GPUs
  the core counts, takes, reclaims and grants again), with :mod:`pdl_spawner.swarm.promises` (free GPUs, promises to
  spawns in progress), :mod:`pdl_spawner.swarm.storage` (homes, data, cache),
  :mod:`pdl_spawner.swarm.idle` (idle engines scaled to 0 and back),
  :mod:`pdl_spawner.swarm.gpu_use` (the GPUs' use, read by the hub's reader service),
  :mod:`pdl_spawner.swarm.limits` (each container's memory, CPUs and processes) and
  :mod:`pdl_spawner.swarm.teardown` (removal).
- :mod:`pdl_spawner.swarm.specs`: the services' specs (pure);
  :mod:`pdl_spawner.swarm.gpus`: the one reader of who holds which GPU (pure);
  :mod:`pdl_spawner.swarm.state`: the server's state, task facts, ports (pure);
  :mod:`pdl_spawner.swarm.networks`: each server's private network.
- :mod:`pdl_spawner.swarm.hub_address`: where the hub's proxy listens on a manager.
- :mod:`pdl_spawner.swarm.admin_source`: the admin view's source (the GPUs PDL's
  engine tasks hold, from the manager).
- :mod:`pdl_spawner.swarm.kind`: the kind's plug-in (its variables, its hub settings).
- :mod:`pdl_spawner.swarm.engine_host`: the user's server's engines of this kind.
- :mod:`pdl_spawner.swarm.engine_boot`: ``pdl-engine``, an engine in a Docker Swarm task.
"""


def __getattr__(name):
    """``PDLSwarmSpawner``, imported when first asked for (the admin view imports only its
    ``admin_source`` module, without the spawner's dependencies)."""
    if name == "PDLSwarmSpawner":
        from pdl_spawner.swarm.spawner import PDLSwarmSpawner

        return PDLSwarmSpawner
    raise AttributeError(name)
