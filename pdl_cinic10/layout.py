"""Where CINIC-10 lives on disk and whether a folder holds it (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

from . import CLASSES, SPLITS

LAYOUT = "<root>/{train,valid,test}/<class>/*.png"
"""The official layout, as quoted in error messages."""


def default_root() -> Path:
    """``$CINIC10_DIR`` if set, else ``~/data/cinic10``."""
    return Path(os.environ.get("CINIC10_DIR") or "~/data/cinic10").expanduser()


def sample_root() -> Path:
    """Where the synthetic sample is cached: ``~/.cache/pdl/cinic10-sample``."""
    return Path.home() / ".cache" / "pdl" / "cinic10-sample"


def has_layout(root: str | os.PathLike) -> bool:
    """True if every ``root/<split>/<class>`` folder exists."""
    root = Path(root)
    return all((root / split / name).is_dir() for split in SPLITS for name in CLASSES)
