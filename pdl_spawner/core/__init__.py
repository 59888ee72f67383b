"""What every cluster kind's spawner shares, and the hub's own parts.

- :mod:`pdl_spawner.core.spawner`: the spawner core (the worker count and its limits,
  reserving at once or in the queue, the engine lease), in the words of
  :mod:`pdl_spawner.core.usage` (workers, who holds them); a kind adds its own I/O.
- :mod:`pdl_spawner.core.host_server`: the server as a local process tree, as the
  user's own Unix account (the local and Slurm kinds' server part).
- :mod:`pdl_spawner.core.form`: the spawn form and its messages (pure functions).
- :mod:`pdl_spawner.core.gpu_types`: the GPU type of a spawn, where a cluster has several.
- :mod:`pdl_spawner.core.queueing` and :mod:`pdl_spawner.core.wait_queue`: the fair
  queue for busy workers; :mod:`pdl_spawner.core.idle_engines`: idle engines giving
  them back; :mod:`pdl_spawner.core.session_limit`: the longest session, enforced;
  :mod:`pdl_spawner.core.gpu_idle`: GPUs held idle, read and flagged.
- :mod:`pdl_spawner.core.reservations`: the persistent slot ledger of one machine, and
  the reclaim log.
- :mod:`pdl_spawner.core.accounts`: each user's own login (jupyterhub-nativeauthenticator),
  with its pages (:mod:`pdl_spawner.core.account_pages`),
  and :mod:`pdl_spawner.core.credentials`: the admin's first password.
- :mod:`pdl_spawner.core.unix_accounts`: one Unix account per hub user (as root).
- :mod:`pdl_spawner.core.device_cgroup`: per-server GPU device isolation and process
  tracking; :mod:`pdl_spawner.core.port_filter`: which ports of the hub's range a
  server may bind (its own); :mod:`pdl_spawner.core.bpf`: eBPF programs on cgroups,
  by the bpf() syscall (for the two above); :mod:`pdl_spawner.core.private_tmp`: each
  server's own /tmp, /var/tmp and /dev/shm; :mod:`pdl_spawner.core.account_limits`: the
  processes and memory each user may have; :mod:`pdl_spawner.core.cpu_limits`: the CPU
  each server may take, each engine kept on its slot's cores and ended with the slot;
  :mod:`pdl_spawner.core.cgroup_v2`: the same bounds on hosts with cgroup v2 only.
- :mod:`pdl_spawner.core.request_limits`: the largest request body the hub reads.
- :mod:`pdl_spawner.core.public_url`: the hub's public URL, each user's server an
  origin of its own.
- :mod:`pdl_spawner.core.admin_frame`: the admin view's page and handlers, over a
  kind's source.
- :mod:`pdl_spawner.core.sqlite_file` and :mod:`pdl_spawner.core.db_thread`: the hub's
  SQLite files, and the one thread that calls them off the event loop.
"""
