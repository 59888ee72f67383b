"""PDL hub side: spawners that reserve GPU (or CPU) slots and start a user's engines.

- :mod:`pdl_spawner.core`: what every spawner shares (the worker count and its limits,
  the spawn form, reserving at once or in the queue, the engine lease), in the words
  of :mod:`pdl_spawner.usage` (workers, who holds them); a spawner adds its own I/O.
- :mod:`pdl_spawner.local`: the embedded default, local processes on one machine.
- :mod:`pdl_spawner.swarm`: Docker Swarm (the services' life), with
  :mod:`pdl_spawner.swarm_promises` (free GPUs, promises to spawns in progress),
  :mod:`pdl_spawner.swarm_storage` (homes, data, cache), :mod:`pdl_spawner.swarm_idle`
  (idle engines scaled to 0 and back), :mod:`pdl_spawner.swarm_teardown` (removal),
  :mod:`pdl_spawner.swarm_specs` (the services' specs, pure),
  :mod:`pdl_spawner.swarm_gpus` (the one reader of who holds which GPU, pure),
  :mod:`pdl_spawner.swarm_state` (the server's state, task facts, ports; pure) and
  :mod:`pdl_spawner.swarm_networks` (each server's private network); and
  :mod:`pdl_spawner.hub_address` (where the hub's proxy listens on a manager).
- :mod:`pdl_spawner.slurm`: a Slurm cluster (each server's GPUs one job of the user's
  account, its engines the job's steps), with :mod:`pdl_spawner.slurm_cli` (the one
  place that runs Slurm's commands), :mod:`pdl_spawner.slurm_jobs` (their arguments
  and JSON read into jobs and nodes; pure), :mod:`pdl_spawner.slurm_form` (the
  form's partition and time limit; pure) and :mod:`pdl_spawner.slurm_placement`
  (where the server runs: the login node, or a step of its own job). Slurm holds the
  reservations: no ledger.
- :mod:`pdl_spawner.queueing` and :mod:`pdl_spawner.wait_queue`: the fair queue for
  busy workers; :mod:`pdl_spawner.idle_engines`: idle engines giving them back.
- :mod:`pdl_spawner.reservations`: the persistent slot ledger (one machine).
- :mod:`pdl_spawner.form`: the spawn form and its messages (pure functions).
- :mod:`pdl_spawner.accounts`: each user's own login (jupyterhub-nativeauthenticator),
  and :mod:`pdl_spawner.credentials`: the admin's first password.
- :mod:`pdl_spawner.request_limits`: the largest request body the hub reads.
- :mod:`pdl_spawner.public_url`: the hub's public URL, each user's server an origin of its own.
- :mod:`pdl_spawner.unix_accounts`: one Unix account per hub user (as root).
- :mod:`pdl_spawner.device_cgroup`: per-server GPU device isolation and process tracking.
- :mod:`pdl_spawner.port_filter`: which ports of the hub's range a server may bind (its own).
- :mod:`pdl_spawner.bpf`: eBPF programs on cgroups, by the bpf() syscall (for the two above).
- :mod:`pdl_spawner.admin_view`: the admin's page of holdings, queue and reclaims.
- :mod:`pdl_spawner.sqlite_file` and :mod:`pdl_spawner.db_thread`: the hub's SQLite
  files, and the one thread that calls them off the event loop.
"""


def __getattr__(name):
    if name == "PDLLocalSpawner":
        from .local import PDLLocalSpawner

        return PDLLocalSpawner
    raise AttributeError(name)
