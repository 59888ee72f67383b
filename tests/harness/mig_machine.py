"""A machine with a GPU split by MIG, as nvidia-smi and the driver show it: GPU 0, an
A100, split into two 3g.20gb MIG devices (GPU instances 1 and 2, each with compute
instance 0); GPU 1, a Tesla T4, whole. :func:`fake_nvidia_smi` writes an nvidia-smi
that answers ``-L``, its plain table, ``--query-gpu=index[,name]`` and (any other
query) ``readings``; :func:`stand_in_mig_machine` adds the driver's ``mig-minors`` and
stand-in device nodes (root only: mknod) and returns the hub config that uses them."""

from __future__ import annotations

import os
from pathlib import Path

MIG_UUIDS = ("MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb")
MIG_TYPE = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"

LISTING = f"""GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: {MIG_UUIDS[0]})
  MIG 3g.20gb     Device  1: (UUID: {MIG_UUIDS[1]})
GPU 1: Tesla T4 (UUID: GPU-1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718)
"""

TABLE = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
+-----------------------------------------------------------------------------------------+
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|      Shared           |
|      ID  ID  Dev |                       BAR1-Usage | SM     Unc| CE ENC DEC OFA JPG    |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|
|  0    1   0   0  |              13MiB / 20096MiB    | 42      0 |  3   0    2    0    0 |
|                  |                 0MiB / 32767MiB  |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
|  0    2   0   1  |              13MiB / 20096MiB    | 42      0 |  3   0    2    0    0 |
|                  |                 0MiB / 32767MiB  |           |                       |
+------------------+----------------------------------+-----------+-----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""

NAMES = "0, NVIDIA A100-SXM4-40GB\n1, Tesla T4\n"

#: The driver's capability minors: GI 1 and its CI 0, GI 2 and its CI 0 of GPU 0.
MINORS = {"gpu0/gi1/access": 12, "gpu0/gi1/ci0/access": 13, "gpu0/gi2/access": 21, "gpu0/gi2/ci0/access": 22}


def fake_nvidia_smi(folder: Path, readings: str = "") -> str:
    """The fake nvidia-smi in ``folder`` (its answers beside it); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    answers = {"listing": LISTING, "table": TABLE, "names": NAMES, "readings": readings}
    for name, text in answers.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    smi = folder / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  -L) cat {folder}/listing ;;
  "") cat {folder}/table ;;
  --query-gpu=index,name) cat {folder}/names ;;
  --query-gpu=index) cut -d, -f1 {folder}/names ;;
  *) cat {folder}/readings ;;
esac
""")
    smi.chmod(0o755)
    return str(smi)


def write_minors(path: Path) -> None:
    """The driver's ``mig-minors`` file of :data:`MINORS` at ``path`` (readable by all)."""
    path.write_text("".join(f"{name} {minor}\n" for name, minor in MINORS.items()))
    path.chmod(0o644)


def stand_in_mig_machine(folder: Path) -> str:
    """:func:`fake_nvidia_smi`, the driver's minors file and stand-in nodes (``nvidia0``,
    ``nvidia1``, ``caps/nvidia-cap<minor>``: char devices no driver has, mode 0666) in
    ``folder``; returns the hub config lines that use them."""
    smi = fake_nvidia_smi(folder)
    (folder / "caps").mkdir()
    nodes = [folder / "nvidia0", folder / "nvidia1"] + [folder / "caps" / f"nvidia-cap{m}" for m in MINORS.values()]
    for minor, node in enumerate(nodes):
        os.mknod(node, 0o666 | 0o020000, os.makedev(240, minor))
        node.chmod(0o666)
    write_minors(folder / "mig-minors")
    return (f"c.PDLLocalSpawner.gpu_device_template = {str(folder / 'nvidia{index}')!r}\n"
            f"c.PDLLocalSpawner.nvidia_smi = {smi!r}\n"
            f"c.PDLLocalSpawner.mig_minors_file = {str(folder / 'mig-minors')!r}\n"
            f"c.PDLLocalSpawner.mig_cap_template = {str(folder / 'caps' / 'nvidia-cap{minor}')!r}\n")
