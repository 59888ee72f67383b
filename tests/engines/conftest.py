"""Fixtures of the engines' tests: the GPU kit's stand-in GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_machine import gpu_machine


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The "GPU machine" (``gpu_machine.gpu_machine``), for a module."""
    return gpu_machine(tmp_path_factory)
