"""The server contract (pdl/contract.py): what a spawner tells a user's server,
as environment variables, built and parsed in one place. Golden values: a change here
is a change of what running servers and images expect."""

from __future__ import annotations

import pytest

from pdl.contract import ServerContract, cluster_dir_in


def test_a_local_servers_contract_is_exactly_these_variables():
    contract = ServerContract(kind="local", slots=("gpu:0", "gpu:2"), workers=2, cluster_dir="/home/ann/.pdl/cluster",
                              idle_timeout_s=600)
    assert contract.env() == {
        "PDL_KIND": "local",
        "PDL_SLOTS": "gpu:0,gpu:2",
        "PDL_WORKERS": "2",
        "PDL_CLUSTER_DIR": "/home/ann/.pdl/cluster",
        "PDL_ENGINE_IDLE_TIMEOUT": "600",
    }


def test_a_swarm_servers_contract_is_exactly_these_variables():
    contract = ServerContract(kind="swarm", workers=3, cluster_dir="/tmp/pdl-cluster",
                              controller_secret="/run/secrets/pdl-notebook.json")
    assert contract.env() == {
        "PDL_KIND": "swarm",
        "PDL_WORKERS": "3",
        "PDL_CLUSTER_DIR": "/tmp/pdl-cluster",
        "PDL_CONTROLLER_SECRET": "/run/secrets/pdl-notebook.json",
    }


@pytest.mark.parametrize("contract", [
    ServerContract(),
    ServerContract(slots=("cpu:0",), cluster_dir="/c", idle_timeout_s=2.5, cluster_file="/c/f.json"),
    ServerContract(workers=8, controller_secret="/run/secrets/x", cluster_dir="/tmp/pdl-cluster"),
    ServerContract(slots=("cpu:1",), session_warn_s=600, session_limit_s=28800, session_ends_at=1_800_000_000.25,
                   session_extendable=True),
    ServerContract(kind="slurm", workers=2, job=42, gpu_type="a100"),
    ServerContract(slots=("cpu:0",), controller_ports=tuple(range(20001, 20019))),
    ServerContract(slots=("mig:1",), nvidia_smi="/opt/nvidia/bin/nvidia-smi", pool=("gpu:1", "mig:0", "mig:1")),
    ServerContract(slots=("cpu:0",), entry_key="bm90LWEta2V5", relay_mark="0f" * 32),
])
def test_what_the_builder_writes_the_parser_reads_back(contract):
    assert ServerContract.from_env(contract.env()) == contract


def test_the_default_cluster_folder():
    assert ServerContract().cluster_path.as_posix().endswith("/.pdl/cluster")
    assert cluster_dir_in("/home/ann") == "/home/ann/.pdl/cluster"


@pytest.mark.parametrize("env, words", [
    ({"PDL_WORKERS": "-1"}, ["PDL_WORKERS='-1'", ">= 0"]),
    ({"PDL_WORKERS": "three"}, ["PDL_WORKERS='three'", ">= 0"]),
    ({"PDL_ENGINE_IDLE_TIMEOUT": "inf"}, ["PDL_ENGINE_IDLE_TIMEOUT='inf'", ">= 0"]),
    ({"PDL_ENGINE_IDLE_TIMEOUT": "nan"}, ["PDL_ENGINE_IDLE_TIMEOUT='nan'", ">= 0"]),
    ({"PDL_SLOTS": "gpu:0,tpu:1"}, ["tpu:1"]),
    ({"PDL_CONTROLLER_PORTS": "20001,70000"}, ["PDL_CONTROLLER_PORTS='20001,70000'", "ports 1-65535"]),
    ({"PDL_CONTROLLER_PORTS": "20001-20018"}, ["PDL_CONTROLLER_PORTS='20001-20018'", "separated by commas"]),
])
def test_a_malformed_value_is_one_line_naming_the_variable(env, words):
    with pytest.raises(ValueError) as info:
        ServerContract.from_env(env)
    assert all(w in str(info.value) for w in words) and "\n" not in str(info.value), info.value


def test_the_users_limits_travel_to_the_server_and_back():
    contract = ServerContract(workers=2, workers_limit=4, limits_note="Slurm QOS lab: at most 4 GPUs per user.")
    env = contract.env()
    assert env["PDL_WORKERS_LIMIT"] == "4" and env["PDL_LIMITS_NOTE"] == "Slurm QOS lab: at most 4 GPUs per user."
    assert ServerContract.from_env(env) == contract
    with pytest.raises(ValueError, match="PDL_WORKERS_LIMIT='many' is not valid"):
        ServerContract.from_env({"PDL_WORKERS_LIMIT": "many"})
