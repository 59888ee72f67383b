"""The embedded default: each user's server and engines as local processes on one machine.

- :mod:`pdl_spawner.local.spawner`: :class:`PDLLocalSpawner` (entry point ``pdl-local``);
  :mod:`pdl_spawner.local.workers`: its source of workers, the slots of
  :mod:`pdl_spawner.core.reservations`' ledger.
- :mod:`pdl_spawner.local.admin_source`: the admin view's source (the ledger's holdings).
- :mod:`pdl_spawner.local.mig_nodes`: the device nodes a MIG device is opened through.
- :mod:`pdl_spawner.local.kind`: the kind's plug-in (its variable ``PDL_POOL``, its hub settings).
- :mod:`pdl_spawner.local.engine_host`: the user's server's engines of this kind.
"""


def __getattr__(name):
    """``PDLLocalSpawner``, imported when first asked for (the admin view imports only its
    ``admin_source`` module, without the spawner's dependencies)."""
    if name == "PDLLocalSpawner":
        from pdl_spawner.local.spawner import PDLLocalSpawner

        return PDLLocalSpawner
    raise AttributeError(name)
