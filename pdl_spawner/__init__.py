"""PDL hub side: spawners that reserve GPU (or CPU) slots and start a user's engines.

- :mod:`pdl_spawner.local`: the embedded default, local processes on one machine.
- :mod:`pdl_spawner.reservations`: the persistent slot ledger.
- :mod:`pdl_spawner.form`: the spawn form and its messages (pure functions).
"""


def __getattr__(name):
    if name == "PDLLocalSpawner":
        from .local import PDLLocalSpawner

        return PDLLocalSpawner
    raise AttributeError(name)
