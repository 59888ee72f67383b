"""Reading a setting back from a traitlets config as a class would see it.

A value may be set on any section a class reads (``c.SpawnerCore.x`` or
``c.PDLLocalSpawner.x``); the most specific one wins, as when the class loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def effective(c, sections: Sequence[str], name: str, default: Any = None) -> Any:
    """``name`` as a class whose sections are ``sections`` (most general first, as
    ``Configurable.section_names()`` gives them) would load it from config ``c``;
    ``default`` where no section sets it."""
    value = default
    for section in sections:
        if section in c and name in c[section]:
            value = c[section][name]
    return value
