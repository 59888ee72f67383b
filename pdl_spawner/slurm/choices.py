"""What a Slurm user may choose at spawn, where the admin offers it: a partition and a
time limit (settings, the spawn's choice checked); and the GPU types of each partition,
Slurm's GRES types as last read from ``sinfo`` (no setting), for the GPU type choice
(:mod:`pdl_spawner.core.gpu_types`). Settings of
:class:`~pdl_spawner.slurm.spawner.PDLSlurmSpawner`; the form's fields are
:mod:`pdl_spawner.slurm.form`, offered through the kind's source of workers
(:mod:`pdl_spawner.slurm.workers`)."""

from __future__ import annotations

from tornado import web
from traitlets import HasTraits, Integer, List, Unicode

from pdl_spawner.slurm import form as slurm_form


class SlurmChoices(HasTraits):
    """Mixin: the partition and time limit of a spawn, and the GPU types of its
    partition (see the module docstring); the spawner records the types it reads in
    :attr:`known_gpu_types`."""

    #: GPU types of each partition ("" : the default), as last read from Slurm.
    known_gpu_types: dict[str, list[str]] = {}

    partition = Unicode(
        "", config=True,
        help="Slurm partition of the reservations; empty: the cluster's default partition.",
    )

    partitions = List(
        Unicode(), config=True,
        help="""Partitions users may choose in the spawn form (the first is the default);
        with fewer than two, there is no choice and `partition` is used.""",
    )

    time_limit = Integer(
        0, config=True,
        help="Time limit of a reservation (minutes, sbatch --time); 0: the partition's default.",
    )

    max_time_limit = Integer(
        0, config=True,
        help="""Longest time limit (minutes) users may choose in the spawn form, which then
        asks for one (pre-filled with `time_limit`, else this); 0: no choice.""",
    )

    def partition_in(self, options: dict) -> str:
        """The partition ``options`` name when it is one offered, else the default one
        (unchecked: :attr:`chosen_partition` refuses a bad choice)."""
        if len(self.partitions) > 1:
            return options.get("partition") if options.get("partition") in self.partitions else self.partitions[0]
        return self.partition

    def partition_gpu_types(self, options: dict) -> list[str]:
        """The GPU types of the partition ``options`` name, as last read ([] before a read)."""
        return SlurmChoices.known_gpu_types.get(self.partition_in(options), [])

    def chosen_option(self, name: str, check, *args):
        """``check(value, *args)`` of the user's option ``name`` when it is one this
        spawner offers, else None; HTTPError(400, one line) for a value ``check`` refuses."""
        options = self.user_options if isinstance(self.user_options, dict) else {}
        if name not in options or name not in self.workers.more_options():
            return None
        try:
            return check(options[name], *args)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None

    @property
    def chosen_partition(self) -> str:
        """The partition of this spawn: the user's choice among `partitions`, else `partition`."""
        chosen = self.chosen_option("partition", slurm_form.check_partition, self.partitions)
        return chosen or (self.partitions[0] if len(self.partitions) > 1 else self.partition)

    @property
    def chosen_time_limit(self) -> int:
        """The time limit (minutes) of this spawn: the user's choice up to `max_time_limit`, else `time_limit`."""
        chosen = self.chosen_option("time_limit", slurm_form.check_time_limit, self.max_time_limit)
        return chosen or self.time_limit
