"""Whether ``torch.compile`` can run on a GPU here, found before a run needs it.

On a CUDA GPU, Inductor (``torch.compile``'s default backend) writes Triton kernels and
builds a small C launcher for each with this machine's C compiler, against Python's C
headers. A bare GPU machine often lacks one or the other, and then the first compiled
step fails minutes into a run ("Failed to find C compiler", "Python.h: No such file").
:func:`compile_problem` says so up front, in one line; :func:`pdl_cinic10.train.fit`
then trains uncompiled and says why, and ``scripts/gpu-check`` reports it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path

#: The compilers Triton looks for on Linux when ``$CC`` is not set, in its order (not ``cc``).
C_COMPILERS = ("gcc", "clang")


def c_compiler() -> str | None:
    """The C compiler Triton would use: ``$CC``, else the first of :data:`C_COMPILERS` on PATH."""
    return os.environ.get("CC") or next(filter(None, (shutil.which(c) for c in C_COMPILERS)), None)


def python_header() -> Path | None:
    """``Python.h`` where Triton's compiles find it: Python's own include folder, or a
    folder of ``$CPATH`` (the compiler's own search path)."""
    folders = [sysconfig.get_paths()["include"], *filter(None, os.environ.get("CPATH", "").split(os.pathsep))]
    return next((Path(f) / "Python.h" for f in folders if (Path(f) / "Python.h").is_file()), None)


def compile_problem() -> str | None:
    """None when ``torch.compile`` has what it needs on a CUDA GPU here; else one line
    naming what is missing and how to get it."""
    if c_compiler() is None:
        return (f"no C compiler ($CC, or {', '.join(C_COMPILERS)} on PATH), which torch.compile's Triton kernels "
                "need (install gcc)")
    if python_header() is None:
        return (f"no Python.h (not in {sysconfig.get_paths()['include']} nor $CPATH), which torch.compile's "
                "Triton kernels are built against (install python3-dev)")
    if importlib.util.find_spec("triton") is None:
        return "no triton package (torch's CUDA wheels bring it): torch.compile cannot build GPU kernels"
    return None
