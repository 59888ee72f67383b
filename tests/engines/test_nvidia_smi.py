"""``nvidia-smi`` asked in one place (pdl/nvidia_smi.py), with fake ``nvidia-smi``
programs: what the machine's pool and the panel read from its rows."""

from __future__ import annotations

import pytest

from pdl.nvidia_smi import query_gpus
from pdl.slots import detect_gpus

pytestmark = pytest.mark.unit


def fake_smi(tmp_path, script: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_each_gpu_is_one_row_of_the_fields_asked_for_in_their_order(tmp_path):
    smi = fake_smi(tmp_path, 'echo "$1" > "$(dirname "$0")/asked"\n'
                             'echo "0, GPU-aaaa, NVIDIA A40"\necho "1, GPU-bbbb"\necho "2, GPU-cccc, NVIDIA A100 80GB"\n')
    rows = query_gpus(("index", "uuid", "name"), nvidia_smi=smi)
    assert rows == [{"index": "0", "uuid": "GPU-aaaa", "name": "NVIDIA A40"},
                    {"index": "2", "uuid": "GPU-cccc", "name": "NVIDIA A100 80GB"}]  # the short row left out
    assert (tmp_path / "asked").read_text().strip() == "--query-gpu=index,uuid,name"



def test_the_pool_has_one_slot_per_gpu_index(tmp_path):
    assert detect_gpus(fake_smi(tmp_path, 'echo 0\necho 1\necho 3\n')) == ["gpu:0", "gpu:1", "gpu:3"]


@pytest.mark.parametrize("script", ["exit 9\n", "sleep 5\n"])
def test_a_failing_or_hanging_nvidia_smi_means_no_gpu(tmp_path, script):
    smi = fake_smi(tmp_path, script)
    assert query_gpus(("index",), nvidia_smi=smi, timeout_s=0.5) == []
    assert query_gpus(("index",), nvidia_smi=str(tmp_path / "missing")) == []


def test_mig_devices_are_listed_with_their_gpu_profile_uuid_and_instances(tmp_path):
    from mig_machine import MIG_UUIDS, fake_nvidia_smi

    from pdl.nvidia_smi import MigDevice, mig_devices

    devices = mig_devices(nvidia_smi=fake_nvidia_smi(tmp_path))
    assert devices == [
        MigDevice(gpu=0, device=0, profile="3g.20gb", uuid=MIG_UUIDS[0], gpu_name="NVIDIA A100-SXM4-40GB",
                  gpu_instance=1, compute_instance=0),
        MigDevice(gpu=0, device=1, profile="3g.20gb", uuid=MIG_UUIDS[1], gpu_name="NVIDIA A100-SXM4-40GB",
                  gpu_instance=2, compute_instance=0),
    ]
    assert devices[0].type == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"


def test_a_machine_with_a_gpu_split_by_mig_pools_its_mig_devices_and_its_whole_gpus(tmp_path):
    from mig_machine import MIG_TYPE, MIG_UUIDS, fake_nvidia_smi

    from pdl.slots import engine_env, holds_gpu, slot_types

    smi = fake_nvidia_smi(tmp_path)
    assert detect_gpus(smi) == ["gpu:1", "mig:0", "mig:1"]  # GPU 0 only as its MIG devices
    assert slot_types(smi) == {"gpu:0": "NVIDIA A100-SXM4-40GB", "gpu:1": "Tesla T4", "mig:0": MIG_TYPE,
                               "mig:1": MIG_TYPE}
    assert engine_env("mig:1", detect_gpus(smi), range(6), nvidia_smi=smi)["CUDA_VISIBLE_DEVICES"] == MIG_UUIDS[1]
    with pytest.raises(ValueError, match="no MIG device mig:2 on this machine: nvidia-smi -L lists mig:0, mig:1"):
        engine_env("mig:2", detect_gpus(smi), range(6), nvidia_smi=smi)
    assert holds_gpu("mig:0") and holds_gpu("gpu:3") and not holds_gpu("cpu:0") and not holds_gpu("mig")


def test_a_machine_without_mig_lists_no_mig_device(tmp_path):
    from pdl.nvidia_smi import mig_devices

    smi = fake_smi(tmp_path, 'echo "GPU 0: NVIDIA A40 (UUID: GPU-aaaa)"\n')
    assert mig_devices(nvidia_smi=smi) == [] and mig_devices(nvidia_smi=str(tmp_path / "missing")) == []
