"""Horovod's GPU build for the GPU machine's Python (scripts/build-horovod), configured
here, on a machine without a GPU: its CMake step finds a CUDA toolkit and the NCCL of
torch's CUDA wheel (in the stand-in GPU machine, tests/harness/gpu_machine.py), linked
shared. Without nvcc or a Python 3.12 it skips, with the reason. (Apart from the GPU
check's tests: it needs no bundle, and no limit of the check's.)
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from gpu_machine import needs_python_312, run

pytestmark = pytest.mark.timeout(900)


@needs_python_312
@pytest.mark.skipif(shutil.which("nvcc") is None,
                    reason="no CUDA toolkit (nvcc) here: Horovod's GPU build configures only with one")
@pytest.mark.integration
def test_horovods_gpu_build_configures_against_the_nccl_of_torchs_wheel(target, tmp_path):
    """Horovod's CMake configure step for an NCCL build, as scripts/build-horovod runs it
    for the GPU machine's Python: it finds this machine's CUDA toolkit and the NCCL of
    torch's wheel, linked shared; no variable is left NOTFOUND."""
    done = run("bash", "scripts/build-horovod", str(target / "bin" / "python"), "--configure-only",
               str(tmp_path / "build"), env={**os.environ, "HOROVOD_GPU_OPERATIONS": "NCCL"})
    wheel_nccl = re.search(r"^build-horovod: NCCL from torch's wheel: (\S+)$", done.stdout, re.M)
    assert wheel_nccl and Path(wheel_nccl.group(1)).parts[-4:-2] == ("nvidia", "nccl"), done.stdout
    log = (tmp_path / "build" / "configure.log").read_text()
    assert "-- Linking against shared NCCL library" in log and "-- Found CUDAToolkit: " in log, log
    assert re.search(r"^-- Found NCCL \(include: \S+/nccl/include, library: \S+/nccl/lib/libnccl\.so\)$", log, re.M), log
    assert "NOTFOUND" not in log, log
