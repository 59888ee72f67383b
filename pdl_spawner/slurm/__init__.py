"""Slurm: each server's GPUs one job of the user's account, its engines the job's steps.

Slurm holds the reservations: no ledger.

- :mod:`pdl_spawner.slurm.spawner`: :class:`PDLSlurmSpawner` (entry point ``pdl-slurm``);
  :mod:`pdl_spawner.slurm.workers`: its source of workers, one Slurm job per server.
- :mod:`pdl_spawner.slurm.cli`: the one place that runs Slurm's commands;
  :mod:`pdl_spawner.slurm.jobs`: their arguments and JSON read into jobs and nodes
  (pure); :mod:`pdl_spawner.slurm.choices`: the partition and time limit a user may
  choose (settings, checks), with :mod:`pdl_spawner.slurm.form`, their form fields (pure);
  :mod:`pdl_spawner.slurm.qos`: the QOS that applies to a user's jobs and its limits
  (pure); :mod:`pdl_spawner.slurm.time_limits`: how far a job's time limit may be
  extended (pure); :mod:`pdl_spawner.slurm.placement`: where the server runs (the login node, or a step
  of its own job).
- :mod:`pdl_spawner.slurm.admin_source`: the admin view's source (Slurm's jobs and
  nodes, through its commands); :mod:`pdl_spawner.slurm.accounting`: the usage report's
  GPU-hours from Slurm's own accounting (``sacct``).
- :mod:`pdl_spawner.slurm.kind`: the kind's plug-in (its variables, its hub settings).
- :mod:`pdl_spawner.slurm.engine_host`: the user's server's engines of this kind.
- :mod:`pdl_spawner.slurm.job_clock`: when a job's time limit ends, as the server reads it.
- :mod:`pdl_spawner.slurm.engine_boot`: an engine as a step of the user's Slurm job.
- :mod:`pdl_spawner.slurm.step_guard`: the task of a Slurm step that runs a server inside its job.
"""


def __getattr__(name):
    """``PDLSlurmSpawner``, imported when first asked for (the admin view imports only its
    ``admin_source`` module, without the spawner's dependencies)."""
    if name == "PDLSlurmSpawner":
        from pdl_spawner.slurm.spawner import PDLSlurmSpawner

        return PDLSlurmSpawner
    raise AttributeError(name)
