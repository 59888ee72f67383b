"""The device nodes a MIG device is opened through, for the device cgroup.

A process uses a MIG device through its GPU's node (``/dev/nvidia<gpu>``) and the
capability nodes of its GPU instance and compute instance (``/dev/nvidia-caps/
nvidia-cap<minor>``, the minors listed in ``/proc/driver/nvidia-caps/mig-minors`` as
``gpu<g>/gi<i>/access <minor>`` and ``gpu<g>/gi<i>/ci<c>/access <minor>``). Users who
hold MIG devices of one GPU all open its node; the capability nodes keep each to
their own device.
"""

from __future__ import annotations

from pathlib import Path

from pdl.nvidia_smi import MigDevice

#: Where the driver lists the capability minors of every GPU and compute instance.
MIG_MINORS_FILE = "/proc/driver/nvidia-caps/mig-minors"
#: The capability node of minor ``{minor}``.
CAP_TEMPLATE = "/dev/nvidia-caps/nvidia-cap{minor}"


def read_minors(path: str | Path = MIG_MINORS_FILE) -> dict[str, int]:
    """``"gpu0/gi1/access"`` -> its minor, as ``path`` lists them ({} without the file)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    minors = {}
    for line in text.splitlines():
        name, _, minor = line.strip().rpartition(" ")
        if name and minor.isdigit():
            minors[name] = int(minor)
    return minors


def cap_nodes(device: MigDevice, minors: dict[str, int], template: str = CAP_TEMPLATE) -> list[Path]:
    """The capability nodes of ``device``'s GPU instance and compute instance (those
    ``minors`` lists; none where nvidia-smi did not name its instances)."""
    if device.gpu_instance is None:
        return []
    gi = f"gpu{device.gpu}/gi{device.gpu_instance}"
    names = [f"{gi}/access"]
    if device.compute_instance is not None:
        names.append(f"{gi}/ci{device.compute_instance}/access")
    return [Path(template.format(minor=minors[name])) for name in names if name in minors]
