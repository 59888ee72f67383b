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
