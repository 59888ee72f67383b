"""Cluster kinds as plug-ins: what a kind is to the hub, and the registry that finds them.

A kind (the embedded default ``local``, ``swarm``, ``slurm``, ...) is one package that
exports a :class:`ClusterKind` and registers it under the entry-point group
:data:`GROUP` (``pyproject.toml``: ``local = "pdl_spawner.local.kind:KIND"``). The hub's
config (:mod:`pdl_spawner.settings.hub_config`) and the admin view
(:mod:`pdl_spawner.admin.view`) pick a kind by its name (``PDL_SPAWNER``) through
:func:`kind_named`, and never branch on one: what differs is what the kind's object says.

A kind's object is light: it names its heavier parts by import path, so reading the
registry imports no spawner (the Swarm one needs Docker's client) and no admin source.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pdl.contract import KINDS_GROUP as GROUP
from pdl_spawner.settings.variables import Variable


@dataclass(frozen=True)
class ClusterKind:
    """One cluster kind, as the hub sees it.

    - ``name``: its ``PDL_SPAWNER`` value;
    - ``spawner``: the spawner class, ``"module:Class"``;
    - ``engine_host``: the user's server's engine host,
      ``"module:Class"`` (a :class:`pdl_server.engine_hosts.EngineHost` with
      ``for_contract(contract, cluster)``), which the server loads by the kind's name;
    - ``admin_source``: the module of the admin view's source for it, which provides
      ``reader(settings: dict) -> Callable[[], dict]`` (the status model) and ``PAGE``
      (:class:`pdl_spawner.admin.frame.PageParts`);
    - ``variables``: its own ``PDL_*`` variables (:class:`~pdl_spawner.settings.variables.Variable`);
    - ``configure(c, values, state_dir)``: its hub settings, from the values of every
      variable (by name) and the hub's state folder; SystemExit with one line where
      they cannot work (a missing address, a hub that must run as root);
    - ``admin_settings(c)``: what its admin source reads, from the final config
      (JSON-able; passed to ``reader``);
    - ``declines``: variables of every kind that do not apply to it, each with why
      (the hub refuses them in one line);
    - ``problem(c)``: why the final config (the admin's file loaded) cannot work for it,
      in one line, or None.
    """

    name: str
    spawner: str
    engine_host: str
    admin_source: str
    configure: Callable[[Any, Mapping[str, Any], Path], None]
    admin_settings: Callable[[Any], dict]
    variables: tuple[Variable, ...] = field(default=())
    declines: Mapping[str, str] = field(default_factory=dict)
    problem: Callable[[Any], str | None] = field(default=lambda c: None)

    def spawner_class(self) -> type:
        """The spawner class (imported now)."""
        module, _, name = self.spawner.partition(":")
        return getattr(importlib.import_module(module), name)

    def sections(self) -> list[str]:
        """The config sections its spawner reads (``c.<name>.*``), most general first."""
        return self.spawner_class().section_names()

    def admin_module(self):
        """The admin source's module (imported now)."""
        return importlib.import_module(self.admin_source)


@functools.lru_cache(maxsize=1)
def kinds() -> dict[str, ClusterKind]:
    """Every registered kind, by name (read once a process: the admin view asks at each page)."""
    return {point.name: point.load() for point in entry_points(group=GROUP)}


def kind_named(name: str, registered: Mapping[str, ClusterKind] | None = None) -> ClusterKind:
    """The kind called ``name``; ValueError, one line naming the registered ones, else."""
    registered = kinds() if registered is None else registered
    if name not in registered:
        raise ValueError(f"PDL_SPAWNER must be one of {', '.join(sorted(registered))}, got {name[:40]!r}")
    return registered[name]
