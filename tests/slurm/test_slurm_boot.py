"""What an engine started as a Slurm job step sets from Slurm's variables
(pdl_spawner/slurm/engine_boot.py, ``slurm_engine_env``); no Slurm, no engine."""

from __future__ import annotations

import pytest

from pdl_spawner.slurm.engine_boot import slurm_engine_env

pytestmark = pytest.mark.unit

#: What srun gives a task on node n2 bound to its GPU 1 with 4 cores.
STEP = {"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0", "SLURMD_NODENAME": "n2",
        "SLURM_CPUS_PER_TASK": "4", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3"}


def test_the_slot_is_the_gpu_slurm_bound_and_the_host_the_nodes_slurm_name():
    assert slurm_engine_env(STEP) == {"PDL_SLOT": "gpu:1", "PDL_GPU": "1", "PDL_ENGINE_HOST": "n2",
                                      "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}
    assert slurm_engine_env({**STEP, "SLURM_STEP_GPUS": "3,5"})["PDL_SLOT"] == "gpu:3"
    job_only = {k: v for k, v in STEP.items() if k != "SLURM_STEP_GPUS"}
    assert slurm_engine_env(job_only)["PDL_SLOT"] == "gpu:0"  # the job's first GPU on this node


def test_without_a_gpu_the_slot_is_a_cpu_and_threads_default_to_one():
    env = slurm_engine_env({"SLURMD_NODENAME": "n1"})
    assert env == {"PDL_SLOT": "cpu:0", "PDL_ENGINE_HOST": "n1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def test_no_engine_address_without_the_controllers():
    env = slurm_engine_env(STEP)
    assert not {"PDL_ENGINE_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"} & set(env)


def test_the_engine_address_is_on_the_route_to_the_controller_and_collectives_use_its_interface():
    env = slurm_engine_env({**STEP, "PDL_CONTROLLER_IP": "127.0.0.1"})
    assert env["PDL_ENGINE_ADDR"] == "127.0.0.1"
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    assert env["PDL_SLOT"] == "gpu:1" and env["PDL_ENGINE_HOST"] == "n2"


def test_the_admins_interface_and_address_are_kept():
    env = slurm_engine_env({**STEP, "PDL_CONTROLLER_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "ib0"})
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("ib0", "lo")
    given = slurm_engine_env({**STEP, "PDL_CONTROLLER_IP": "127.0.0.1", "PDL_ENGINE_ADDR": "127.0.0.2"})
    assert given["PDL_ENGINE_ADDR"] == "127.0.0.2" and given["GLOO_SOCKET_IFNAME"] == "lo"


def test_the_servers_worker_name_wins_over_the_gpu_index():
    """The Cluster panel matches engines to the reservation's workers (gpu:0..n-1) by
    slot: engines on two nodes both bound to their node's GPU 0 must not both be gpu:0."""
    env = slurm_engine_env({"SLURM_STEP_GPUS": "0", "SLURMD_NODENAME": "n2", "PDL_SLOT": "gpu:1"})
    assert env["PDL_SLOT"] == "gpu:1" and env["PDL_GPU"] == "0" and env["PDL_ENGINE_HOST"] == "n2"


def test_a_slurm_engines_environment_is_read_back_through_the_engine_contract():
    from pdl.engine_contract import EngineContract

    env = slurm_engine_env({"SLURM_STEP_GPUS": "1", "SLURMD_NODENAME": "n2", "PDL_SLOT": "gpu:0"})
    contract = EngineContract.from_env(env)
    assert (contract.slot, contract.gpu, contract.host, contract.addr) == ("gpu:0", "1", "n2", "")
