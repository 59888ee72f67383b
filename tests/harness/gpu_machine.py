"""The GPU machine's stand-in for the GPU kit's tests (tests/engines/): a Python 3.12 (the
GPU machine's version) and, in it, torch as pip gives it there (``scripts/gpu-machine``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*cmd, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` in the repository, its output captured; fails the test unless it exits 0."""
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{cmd[:2]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def python_312() -> str | None:
    """A working Python 3.12 (the GPU machine's), or None: the one ``scripts/gpu-machine``
    makes the GPU machine with (``python3.12`` on PATH, else pyenv's)."""
    done = subprocess.run(["bash", "scripts/gpu-machine", "--python"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    return done.stdout.strip() if done.returncode == 0 else None


PYTHON_312 = python_312()
needs_python_312 = pytest.mark.skipif(PYTHON_312 is None, reason="no Python 3.12 here (python3.12 on PATH or pyenv's), "
                                                                 "the GPU machine's version")


def gpu_machine(tmp_path_factory) -> Path:
    """The "GPU machine"'s virtualenv: a Python 3.12 with torch as pip gives it there (a
    CUDA build, with its NCCL and triton wheels), numpy, Pillow and scikit-learn (what the
    bundle assumes), and nothing of PDL (scripts/gpu-machine). scripts/test makes it with
    the machine's set-up and names it in $PDL_GPU_MACHINE; without that, it is made here.
    Skips the test without a Python 3.12."""
    if PYTHON_312 is None:
        pytest.skip("no Python 3.12 here")
    venv = Path(os.environ.get("PDL_GPU_MACHINE") or tmp_path_factory.mktemp("gpu-machine") / "venv")
    run("bash", "scripts/gpu-machine", str(venv))
    found = run(str(venv / "bin" / "python"), "-I", "-c", "import importlib.util as u; print(bool(u.find_spec('pdl')))")
    assert found.stdout.strip() == "False", f"{venv} has PDL installed: it must be a bare GPU machine"
    return venv
