"""PDL hub side: spawners that reserve GPU (or CPU) workers and start a user's engines.

One package per cluster kind, each registering a plug-in (its ``kind`` module: its
spawner, settings and admin-view source), on a shared core:

- :mod:`pdl_spawner.core`: the workers every kind hands out (the spawner core, limits,
  form, queue, engine lease, session and idle limits).
- :mod:`pdl_spawner.host`: the user's server as processes of their Unix account on the
  hub's machine, and the bounds around them (the local and Slurm kinds).
- :mod:`pdl_spawner.accounts`: who may log in (each user's own password, its pages,
  the admin's first one) and the Unix account each user runs as.
- :mod:`pdl_spawner.admin`: the admin's view: its frame, and the service over the
  source of the hub's kind.
- :mod:`pdl_spawner.hub`: the hub process's own parts (its public URL, the largest
  request it reads, its SQLite files and the thread that calls them).
- :mod:`pdl_spawner.local`: the embedded default, local processes on one machine.
- :mod:`pdl_spawner.swarm`: Docker Swarm services.
- :mod:`pdl_spawner.slurm`: a Slurm cluster's jobs and steps.
- :mod:`pdl_spawner.kinds`: what a kind is to the hub, and the registry of them.
- :mod:`pdl_spawner.settings`: the hub's settings, from one table of variables.
"""


def __getattr__(name):
    if name == "PDLLocalSpawner":
        from pdl_spawner.local import PDLLocalSpawner

        return PDLLocalSpawner
    raise AttributeError(name)
