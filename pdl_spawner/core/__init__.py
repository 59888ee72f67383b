"""The workers every cluster kind hands out: what each kind's spawner shares.

- :mod:`pdl_spawner.core.spawner`: the spawner core (the worker count and its limits,
  reserving at once or in the queue, the engine lease), in the words of
  :mod:`pdl_spawner.core.usage` (workers, who holds them); a kind supplies its workers
  as one object, :mod:`pdl_spawner.core.worker_source`'s protocol.
- :mod:`pdl_spawner.core.admission`: spawns admitted before JupyterHub prepares them,
  counted as held until they take their workers.
- :mod:`pdl_spawner.core.form`: the spawn form and its messages (pure functions).
- :mod:`pdl_spawner.core.gpu_types`: the GPU type of a spawn, where a cluster has several.
- :mod:`pdl_spawner.core.queueing` and :mod:`pdl_spawner.core.wait_queue`: the fair
  queue for busy workers; :mod:`pdl_spawner.core.idle_engines`: idle engines giving
  them back; :mod:`pdl_spawner.core.session_limit`: the longest session, enforced;
  :mod:`pdl_spawner.core.gpu_idle`: GPUs held idle, read and flagged.
- :mod:`pdl_spawner.core.reservations`: the persistent slot ledger of one machine, and
  the reclaim log.
"""
