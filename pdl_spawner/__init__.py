"""PDL hub side: spawners that reserve GPU (or CPU) slots and start a user's engines.

- :mod:`pdl_spawner.local`: the embedded default, local processes on one machine.
- :mod:`pdl_spawner.accounts`: each user's own login (jupyterhub-nativeauthenticator).
- :mod:`pdl_spawner.unix_accounts`: one Unix account per hub user (as root).
- :mod:`pdl_spawner.device_cgroup`: per-server GPU device isolation and process tracking.
- :mod:`pdl_spawner.reservations`: the persistent slot ledger.
- :mod:`pdl_spawner.sqlite_file` and :mod:`pdl_spawner.db_thread`: the hub's SQLite
  files, and the one thread that calls them off the event loop.
- :mod:`pdl_spawner.form`: the spawn form and its messages (pure functions).
"""


def __getattr__(name):
    if name == "PDLLocalSpawner":
        from .local import PDLLocalSpawner

        return PDLLocalSpawner
    raise AttributeError(name)
