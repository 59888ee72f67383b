"""The engine contract (pdl/engine_contract.py): what an engine is told, as environment
variables, built and parsed in one place. Golden values: a change here is a change of
what running engines and images expect."""

from __future__ import annotations

import pytest

from pdl.engine_contract import EngineContract
from pdl.slots import engine_env

pytestmark = pytest.mark.unit


def test_a_pinned_engines_contract_is_exactly_these_variables():
    assert EngineContract(slot="gpu:1", cpus=(2, 3)).env() == {"PDL_SLOT": "gpu:1", "PDL_CPUS": "2,3"}
    assert EngineContract(connection="/run/secrets/pdl-engine.json", gpu_resource="NVIDIA-GPU",
                          host="{{.Node.Hostname}}").env() == {
        "PDL_ENGINE_CONNECTION": "/run/secrets/pdl-engine.json",
        "PDL_GPU_RESOURCE": "NVIDIA-GPU",
        "PDL_ENGINE_HOST": "{{.Node.Hostname}}",
    }


def test_no_gpu_reserved_is_said_and_differs_from_not_known():
    assert EngineContract(gpu="").env() == {"PDL_GPU": ""}
    assert EngineContract().env() == {}
    assert EngineContract.from_env({"PDL_GPU": ""}).gpu == ""
    assert EngineContract.from_env({}).gpu is None


@pytest.mark.parametrize("contract", [
    EngineContract(),
    EngineContract(slot="cpu:3", cpus=(6, 7), gpu=""),
    EngineContract(slot="gpu:0", gpu="GPU-8f2c", host="n2", addr="10.0.0.2", connection="/s/e.json",
                   gpu_resource="NVIDIA-GPU"),
])
def test_what_the_builder_writes_the_parser_reads_back(contract):
    assert EngineContract.from_env(contract.env()) == contract


def test_a_malformed_core_list_names_the_variable_and_what_is_valid():
    with pytest.raises(ValueError, match=r"PDL_CPUS='0,x' is not valid: expected core ids"):
        EngineContract.from_env({"PDL_CPUS": "0,x"})


def test_a_pinned_engines_environment_is_read_back_through_the_contract():
    """What pins a local engine says it through the contract (Slurm's and Swarm's boot
    are tested in their kinds' folders)."""
    local = EngineContract.from_env(engine_env("gpu:1", ["gpu:0", "gpu:1"], range(4)))
    assert (local.slot, local.cpus) == ("gpu:1", (2, 3))
