"""The GPU type of a spawn, where a cluster has GPUs of several types (Slurm's GRES types,
Swarm nodes' labels, the embedded default's ``nvidia-smi`` names): the option ``gpu_type``
and its check. With fewer than two types there is no choice, and a ``gpu_type`` sent
anyway is refused as an unknown option.

:class:`GpuTypeChoice` is part of :class:`~pdl_spawner.core.spawner.SpawnerCore`, which
adds the field to the spawn form (:func:`pdl_spawner.core.form.render_gpu_types`) and the
option to those a user may set. The types come from the kind's source of workers
(``self.workers.gpu_types_for(options)``: the types a spawn with ``options`` may choose
among, as last read); kinds use :attr:`GpuTypeChoice.chosen_gpu_type` where they reserve
and count.
"""

from __future__ import annotations

from tornado import web
from traitlets import HasTraits

from pdl_spawner.core import form


class GpuTypeChoice(HasTraits):
    """Part of the core: the spawn's GPU type (see the module docstring)."""

    @property
    def offered_gpu_types(self) -> list[str]:
        """The types this spawn may choose among: two or more, else []."""
        options = self.user_options if isinstance(self.user_options, dict) else {}
        types = self.workers.gpu_types_for(options)
        return types if len(types) > 1 else []

    @property
    def chosen_gpu_type(self) -> str:
        """The spawn's GPU type: its ``gpu_type`` option where types are offered, else ""
        (any); HTTPError(400, one line naming the valid ones) for one not offered."""
        options = self.user_options if isinstance(self.user_options, dict) else {}
        offered = self.offered_gpu_types
        if not offered or "gpu_type" not in options:
            return ""
        try:
            return form.check_gpu_type(options["gpu_type"], offered)
        except ValueError as e:
            raise web.HTTPError(400, str(e), reason=str(e)) from None
