"""Make the NCCL that torch's CUDA wheels bring usable by Horovod's build.

    PYTHON scripts/nccl_of_torch.py DIR     # PYTHON: the one whose torch Horovod builds for

torch's wheels install NCCL as a Python package (``nvidia-nccl-cu13`` and the like):
``nvidia/nccl/include/nccl.h`` and ``nvidia/nccl/lib/libnccl.so.2``, but no
``libnccl.so``, the name a linker looks for. This makes ``DIR/include`` (a link to the
wheel's headers) and ``DIR/lib/libnccl.so`` (a link to its library) and prints DIR: set
``HOROVOD_NCCL_HOME=DIR`` and ``HOROVOD_NCCL_LINK=SHARED`` for Horovod's build
(``scripts/build-horovod`` does). Horovod then links the very library torch loads, so
one process holds one NCCL. Exit 1 with one line when this Python has no such wheel.
"""

from __future__ import annotations

import sys
from pathlib import Path


def wheel_nccl(paths: list[str] | None = None) -> Path | None:
    """The ``nvidia/nccl`` folder of torch's NCCL wheel on ``paths`` (default
    ``sys.path``) holding both ``include/nccl.h`` and ``lib/libnccl.so.<N>``; None
    when there is none."""
    for entry in paths if paths is not None else sys.path:
        folder = Path(entry or ".") / "nvidia" / "nccl"
        if (folder / "include" / "nccl.h").is_file() and sorted((folder / "lib").glob("libnccl.so.*")):
            return folder
    return None


def link_for_build(nccl: Path, target: Path) -> Path:
    """``target/include`` -> ``nccl/include`` and ``target/lib/libnccl.so`` -> the
    wheel's ``libnccl.so.<N>``; returns ``target``."""
    (target / "lib").mkdir(parents=True, exist_ok=True)
    include, library = target / "include", target / "lib" / "libnccl.so"
    for link in (include, library):
        link.unlink(missing_ok=True)
    include.symlink_to(nccl / "include", target_is_directory=True)
    library.symlink_to(sorted((nccl / "lib").glob("libnccl.so.*"))[0])
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: PYTHON scripts/nccl_of_torch.py DIR", file=sys.stderr)
        return 2
    nccl = wheel_nccl()
    if nccl is None:
        print(f"nccl_of_torch: {sys.executable} has no NCCL wheel (nvidia/nccl with include/nccl.h and "
              "lib/libnccl.so.*); torch's CUDA builds bring one", file=sys.stderr)
        return 1
    print(link_for_build(nccl, Path(argv[0]).resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
