"""PDL hub side: spawners that reserve GPU (or CPU) workers and start a user's engines.

One package per cluster kind, each registering a plug-in (its ``kind`` module: its
spawner, settings and admin-view source), on a shared core:

- :mod:`pdl_spawner.core`: what every kind shares (the spawner core, limits, form,
  queue, engine lease, accounts, device cgroups, the admin view's frame).
- :mod:`pdl_spawner.local`: the embedded default, local processes on one machine.
- :mod:`pdl_spawner.swarm`: Docker Swarm services.
- :mod:`pdl_spawner.slurm`: a Slurm cluster's jobs and steps.
- :mod:`pdl_spawner.kinds`: what a kind is to the hub, and the registry of them.
- :mod:`pdl_spawner.settings`: the hub's settings, from one table of variables.
- :mod:`pdl_spawner.admin_view`: the admin's page of holdings, queue and reclaims
  (``python -m pdl_spawner.admin_view``), over the source of the hub's kind.
"""


def __getattr__(name):
    if name == "PDLLocalSpawner":
        from pdl_spawner.local import PDLLocalSpawner

        return PDLLocalSpawner
    raise AttributeError(name)
