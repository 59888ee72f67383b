"""A kind supplies its workers as one protocol object (pdl_spawner/core/worker_source.py),
held by the spawner core: every registered kind's spawner names a complete source, no
class of a kind overrides the core (beyond JupyterHub's own spawner API), and the core
has no hook left for a kind to fill by inheritance."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import Spawner

from pdl_spawner.core.spawner import SpawnerCore
from pdl_spawner.core.worker_source import WorkerSource
from pdl_spawner.kinds import kinds

pytestmark = pytest.mark.unit

CORE = Path(inspect.getfile(SpawnerCore)).parent
#: What a kind's spawner sets for the core: its name and its source's class.
NAMING = {"kind_name", "worker_source"}
#: Python's own members of every class.
PYTHON = {"__module__", "__doc__", "__qualname__", "__annotations__", "__firstlineno__", "__static_attributes__",
          "_trait_default_generators", "__dict__", "__weakref__"}


def core_members() -> set[str]:
    """Names the core's classes define (SpawnerCore and the parts it gathers)."""
    names: set[str] = set()
    for cls in SpawnerCore.__mro__:
        if cls.__module__.startswith("pdl_spawner.core."):
            names |= set(vars(cls))
    return names


@pytest.mark.parametrize("name", sorted(kinds()))
def test_each_kind_names_a_complete_worker_source(name):
    spawner_class = kinds()[name].spawner_class()
    source_class = spawner_class.worker_source
    assert WorkerSource in source_class.__mro__ and not inspect.isabstract(source_class), \
        f"{name}: {source_class} leaves {sorted(getattr(source_class, '__abstractmethods__', ()))} unwritten"
    source = source_class(SimpleNamespace(user=SimpleNamespace(name="ann")))
    assert isinstance(source, WorkerSource) and source.unit in ("workers", "GPUs")


@pytest.mark.parametrize("name", sorted(kinds()))
def test_no_class_of_a_kind_overrides_the_core(name):
    """A kind that overrode a core method (a form, saved state, a reservation step) would
    clash with another spawner library's; what it supplies is its source's."""
    core, jupyterhub_api = core_members(), set(dir(Spawner))
    for cls in kinds()[name].spawner_class().__mro__:
        if cls.__module__.startswith(("pdl_spawner.core.", "jupyterhub.", "dockerspawner.", "traitlets.")):
            continue
        if cls.__module__ in ("builtins", "abc"):
            continue
        overridden = (set(vars(cls)) & core) - jupyterhub_api - NAMING - PYTHON
        assert not overridden, f"{cls.__module__}.{cls.__name__} overrides the core's {sorted(overridden)}"


def test_the_core_has_no_hook_left_for_inheritance():
    """Every member the core needs from a kind is the source's: none raises NotImplementedError."""
    left = [path.name for path in CORE.glob("*.py") if "NotImplementedError" in path.read_text()]
    assert left == []


def test_a_spawner_that_names_no_source_says_so_in_one_line():
    class NoSource(SpawnerCore):
        pass

    with pytest.raises(TypeError, match="NoSource names no worker_source"):
        NoSource().workers
