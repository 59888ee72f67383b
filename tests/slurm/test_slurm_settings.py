"""Slurm's own variables (pdl_spawner/slurm/kind.py): each setting takes effect through
its variable and through its ``c.PDLSlurmSpawner`` line, the controller's address is
required (either way), and the hub's session variables, which a job's time limit
replaces, are refused in one line. The config is loaded as the hub loads it, in a
subprocess (tests/harness/hub_config_probe.py); no hub, no cluster. The kind needs a
hub run as root."""

from __future__ import annotations

import os

import pytest

from hub_config_probe import config_file, expected, load_config, probe, refusal, settings

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(os.geteuid() != 0, reason="PDL_SPAWNER=slurm needs a hub run as root")]

#: A valid value, not the default, of each Slurm variable (each sets a trait).
SAMPLES = {"PDL_CONTROLLER_IP": "10.0.0.5", "PDL_SLURM_PARTITION": "gpu", "PDL_SLURM_ACCOUNT": "lab",
           "PDL_SLURM_SERVER": "allocation"}


def slurm_trait_variables():
    from pdl_spawner.kinds import kind_named

    return [v for v in kind_named("slurm").variables if v.trait]


def test_every_slurm_setting_takes_effect_through_its_variable_and_its_c_line(tmp_path):
    variables = slurm_trait_variables()
    assert sorted(SAMPLES) == sorted(v.name for v in variables), "a sample value for each variable with a trait"
    want = {v.name: expected(v, SAMPLES) for v in variables}
    got = settings(probe(tmp_path, [v.trait for v in variables], PDL_SPAWNER="slurm", **SAMPLES))
    assert {v.name: got[v.trait] for v in variables} == want
    path = config_file(tmp_path / "etc")
    path.write_text("".join(f"c.{v.trait} = {want[v.name]!r}\n" for v in variables))
    got = settings(probe(tmp_path, [v.trait for v in variables], PDL_SPAWNER="slurm", PDL_LOCAL_CONFIG=str(path)))
    assert {v.name: got[v.trait] for v in variables} == want


def test_the_admin_view_is_told_the_partition_prefix_and_flags(tmp_path):
    got = settings(load_config(tmp_path, PDL_SPAWNER="slurm", PDL_CONTROLLER_IP="10.0.0.5",
                               PDL_SLURM_PARTITION="gpu", PDL_ACCOUNT_PREFIX="lab-"))
    view = got["admin_view"]
    assert (view["kind"], view["partition"], view["account_prefix"], view["flags_db"]) == (
        "slurm", "gpu", "lab-", str(tmp_path / "state" / "slurm-flags.sqlite"))


@pytest.mark.parametrize("env, line", [
    ({}, "jupyterhub_config.py: PDL_SPAWNER=slurm needs PDL_CONTROLLER_IP, this machine's address as the compute "
     "nodes reach it (e.g. PDL_CONTROLLER_IP=10.0.0.5)"),
    ({"PDL_CONTROLLER_IP": "10.0.0.5", "PDL_SESSION_LIMIT_S": "3600"}, "PDL_SESSION_LIMIT_S does not apply to "
     "PDL_SPAWNER=slurm: on Slurm a job's time limit is its session's (c.PDLSlurmSpawner.time_limit); unset it"),
    ({"PDL_CONTROLLER_IP": "10.0.0.5", "PDL_SLURM_SERVER": "compute"},
     "PDL_SLURM_SERVER must be one of login, allocation, got 'compute'"),
])
def test_what_slurm_cannot_use_stops_the_hub_in_one_line(tmp_path, env, line):
    assert refusal(load_config(tmp_path, PDL_SPAWNER="slurm", **env)) == line

