"""``nvidia-smi``, asked in one place: the GPUs of this machine, one row per GPU, with
the fields a caller names (:func:`query_gpus`), and the MIG devices their GPUs are
split into (:func:`mig_devices`). Who asks: the machine's pool and its slots' types
(:mod:`pdl.slots`), the Cluster panel's GPU use (:func:`pdl_lab.resources.gpu_stats`)
and the engines' preflight (:mod:`pdl.runtime.preflight`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, replace

#: Seconds ``nvidia-smi`` may take before its answer counts as none.
TIMEOUT_S = 10.0

_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")
#: A row of the "MIG devices" table of plain ``nvidia-smi``: GPU, GI ID, CI ID, MIG Dev.
_MIG_TABLE_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|")


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance's compute instance) as nvidia-smi lists it."""

    gpu: int  #: its GPU's index
    device: int  #: its index on that GPU (``nvidia-smi -L``'s "Device N")
    profile: str  #: "1g.5gb", "3g.20gb", ...
    uuid: str  #: "MIG-...", what ``CUDA_VISIBLE_DEVICES`` selects it by
    gpu_name: str  #: its GPU's name
    gpu_instance: int | None = None  #: GI ID (None where nvidia-smi did not say)
    compute_instance: int | None = None  #: CI ID

    @property
    def type(self) -> str:
        """The GPU type it is offered as: ``"NVIDIA A100-SXM4-40GB MIG 3g.20gb"``."""
        return f"{self.gpu_name} MIG {self.profile}"


def _run(args: list[str], nvidia_smi: str | None, timeout_s: float) -> str | None:
    """nvidia-smi's output for ``args``; None without it, when it fails or times out."""
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def query_gpus(fields: tuple[str, ...], *, nvidia_smi: str | None = None,
               timeout_s: float = TIMEOUT_S) -> list[dict[str, str]]:
    """One ``{field: text}`` per GPU ``nvidia-smi --query-gpu`` lists, in its order (the
    PCI bus order), values stripped and without units; [] without ``nvidia-smi`` (or
    ``nvidia_smi``, a path to use instead), when it fails or takes over ``timeout_s``.
    A row with another number of values than ``fields`` is left out."""
    out = _run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], nvidia_smi, timeout_s)
    rows = [[value.strip() for value in line.split(",")] for line in (out or "").splitlines() if line.strip()]
    return [dict(zip(fields, row)) for row in rows if len(row) == len(fields)]


def mig_devices(*, nvidia_smi: str | None = None, timeout_s: float = TIMEOUT_S) -> list[MigDevice]:
    """The MIG devices ``nvidia-smi -L`` lists, in its order (GPU by GPU); [] where no
    GPU is split (or without nvidia-smi). Their GPU and compute instance IDs come from
    the "MIG devices" table of plain ``nvidia-smi`` (None where it lacks the row)."""
    listing = _run(["-L"], nvidia_smi, timeout_s)
    found, gpu, name = [], None, ""
    for line in (listing or "").splitlines():
        if m := _GPU_LINE.match(line):
            gpu, name = int(m[1]), m[2].strip()
        elif (m := _MIG_LINE.match(line)) and gpu is not None:
            found.append(MigDevice(gpu=gpu, device=int(m[2]), profile=m[1], uuid=m[3].strip(), gpu_name=name))
    if not found:
        return []
    instances = _mig_table(_run([], nvidia_smi, timeout_s) or "")
    return [replace(d, gpu_instance=gi, compute_instance=ci)
            for d in found for gi, ci in [instances.get((d.gpu, d.device), (None, None))]]


def _mig_table(text: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(GPU, MIG device) -> (GI ID, CI ID) from plain nvidia-smi's "MIG devices" table."""
    rows, inside = {}, False
    for line in text.splitlines():
        if "MIG devices:" in line:
            inside = True
        elif inside and "Processes:" in line:
            break
        elif inside and (m := _MIG_TABLE_ROW.match(line)):
            gpu, gi, ci, dev = map(int, m.groups())
            rows[(gpu, dev)] = (gi, ci)
    return rows
