"""``nvidia-smi``, asked in one place: the GPUs of this machine, one row per GPU, with
the fields a caller names. Who asks: the machine's pool (:func:`pdl.slots.detect_gpus`),
the Cluster panel's GPU use (:func:`pdl_lab.resources.gpu_stats`) and the engines'
preflight (:mod:`pdl.runtime.preflight`)."""

from __future__ import annotations

import shutil
import subprocess

#: Seconds ``nvidia-smi`` may take before its answer counts as none.
TIMEOUT_S = 10.0


def query_gpus(fields: tuple[str, ...], *, nvidia_smi: str | None = None,
               timeout_s: float = TIMEOUT_S) -> list[dict[str, str]]:
    """One ``{field: text}`` per GPU ``nvidia-smi --query-gpu`` lists, in its order (the
    PCI bus order), values stripped and without units; [] without ``nvidia-smi`` (or
    ``nvidia_smi``, a path to use instead), when it fails or takes over ``timeout_s``.
    A row with another number of values than ``fields`` is left out."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[value.strip() for value in line.split(",")] for line in out.splitlines() if line.strip()]
    return [dict(zip(fields, row)) for row in rows if len(row) == len(fields)]
