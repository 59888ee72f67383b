"""The GPU type of a spawn, where a cluster has GPUs of several types (Slurm's GRES types,
Swarm nodes' labels, the embedded default's ``nvidia-smi`` names): the option ``gpu_type``, its check and its
field in the spawn form, which lists "Any type" and each type with its free count
(:func:`pdl_spawner.core.form.render_gpu_types`). With fewer than two types there is no
choice, and a ``gpu_type`` sent anyway is refused as an unknown option.

:class:`GpuTypeChoice` is a mixin placed first in a spawner's bases (it adds to the form
and the options of the spawner's other parts). The spawner provides
``gpu_types_for(options)`` (the GPU types a spawn with ``options`` may choose among, as
last read: [] before the spawner has read them, or where its GPUs are of one type) and
``async gpu_type_usage()`` (GPU type, "" for any, -> (free, total), for the form), and
uses :attr:`GpuTypeChoice.chosen_gpu_type` where it reserves and counts.
"""

from __future__ import annotations

from tornado import web
from traitlets import HasTraits

from pdl_spawner.core import form


class GpuTypeChoice(HasTraits):
    """Mixin: the spawn's GPU type (see the module docstring)."""

    @property
    def offered_gpu_types(self) -> list[str]:
        """The types this spawn may choose among: two or more, else []."""
        options = self.user_options if isinstance(self.user_options, dict) else {}
        types = self.gpu_types_for(options)
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

    def more_user_options(self) -> dict[str, str]:
        more = super().more_user_options()
        if self.offered_gpu_types:
            more["gpu_type"] = form.valid_gpu_types(self.offered_gpu_types)
        return more

    async def render_options_form(self, spawner=None) -> str:
        html = await super().render_options_form(spawner)
        if self.offered_gpu_types:
            html += form.render_gpu_types(await self.gpu_type_usage())
        return html

    def options_from_form(self, formdata):
        options = super().options_from_form(formdata)
        try:
            options.update(form.parse_gpu_type(formdata, self.gpu_types_for(options)))
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        return options
