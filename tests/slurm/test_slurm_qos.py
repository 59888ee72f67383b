"""The QOS a user's PDL jobs run under, and the line that shows its limits
(pdl_spawner/slurm/qos.py), from sacctmgr's parsable output."""

from __future__ import annotations

import pytest

from pdl_spawner.slurm.qos import DEFAULT_QOS, QosLimits, parse_qos, qos_of, tres_gpus

pytestmark = pytest.mark.unit

#: sacctmgr --noheader --parsable2 list qos pdl-two format=Name,MaxTRESPU,MaxTRES,MaxWall,MaxJobsPU
TWO_GPU_QOS = "pdl-two|gres/gpu=2|cpu=16,gres/gpu=4|1-00:00:00|3\n"


def test_the_qos_limits_are_read_and_said_in_one_line():
    qos = parse_qos("pdl-two", TWO_GPU_QOS)
    assert qos == QosLimits("pdl-two", gpus_per_user=2, gpus_per_job=4, max_wall="1-00:00:00", jobs_per_user=3)
    assert qos.gpu_cap == 2
    assert qos.note() == ("Slurm QOS pdl-two: at most 2 GPUs per user, at most 4 GPUs a job, at most 3 jobs at once "
                          "per user, jobs of at most 1-00:00:00.")


def test_a_qos_without_limits_says_so_and_caps_nothing():
    qos = parse_qos("normal", "normal||||\n")
    assert qos.gpu_cap is None and qos.note() == "Slurm QOS normal: no limits of its own."


def test_an_unknown_qos_is_one_line_naming_it():
    with pytest.raises(ValueError, match="^Slurm has no QOS named 'gold'$"):
        parse_qos("gold", "")


@pytest.mark.parametrize("tres,gpus", [("gres/gpu=2", 2), ("cpu=8,gres/gpu=3,mem=10G", 3), ("cpu=8", None),
                                       ("gres/gpu:a100=1", None), ("", None)])
def test_only_the_untyped_gpu_count_of_a_tres_list_caps_every_gpu(tres, gpus):
    assert tres_gpus(tres) == gpus


ASSOCIATIONS = "pdl-lab|lab-qos\nroot|\n"


@pytest.mark.parametrize("sbatch_args,account,expected", [
    (["--qos=pdl-two"], "", "pdl-two"),                     # the admin's --qos wins
    (["--qos", "a", "--qos=b"], "", "b"),                   # the last one, as with sbatch
    (["-q", "c"], "pdl-lab", "c"),
    ([], "pdl-lab", "lab-qos"),                             # else the association's default QOS
    ([], "root", DEFAULT_QOS),                              # ...and Slurm's own without one
    ([], "", "lab-qos"),
])
def test_the_qos_is_the_admins_else_the_associations_else_slurms_default(sbatch_args, account, expected):
    assert qos_of(sbatch_args, ASSOCIATIONS, account) == expected
    assert qos_of(sbatch_args, "", account) == (expected if sbatch_args else DEFAULT_QOS)
