"""Docker Swarm's own variables (pdl_spawner/swarm/kind.py): each setting takes effect
through its variable and through its ``c.PDLSwarmSpawner`` line, and what belongs to the
hub's machine only (the users' Unix accounts) is refused in one line. The config is
loaded as the hub loads it, in a subprocess (tests/harness/hub_config_probe.py); no
hub, no swarm."""

from __future__ import annotations

import pytest

from hub_config_probe import config_file, expected, probe, refusal, load_config, settings

pytestmark = pytest.mark.unit

#: The manager's address as the nodes reach it: required on Swarm.
REQUIRED = {"PDL_SPAWNER": "swarm", "PDL_HUB_CONNECT_IP": "127.0.0.1", "PDL_HUB_IP": "127.0.0.1"}
#: A valid value, not the default, of each Swarm variable that sets a trait.
SAMPLES = {"PDL_DEFAULT_GPUS": "2", "PDL_NODES": "gpu1,gpu2", "PDL_NOTEBOOK_IMAGE": "lab/pdl-notebook:0.1.0",
           "PDL_HOME_STORAGE": "path", "PDL_HOME_PATH": "/srv/pdl/home/{username}"}


def swarm_trait_variables():
    from pdl_spawner.kinds import kind_named

    return [v for v in kind_named("swarm").variables if v.trait]


def test_every_swarm_setting_takes_effect_through_its_variable_and_its_c_line(tmp_path):
    variables = swarm_trait_variables()
    assert sorted(SAMPLES) == sorted(v.name for v in variables), "a sample value for each variable with a trait"
    want = {v.name: expected(v, SAMPLES) for v in variables}
    got = settings(probe(tmp_path, [v.trait for v in variables], **REQUIRED, **SAMPLES))
    assert {v.name: got[v.trait] for v in variables} == want
    path = config_file(tmp_path / "etc")
    path.write_text("".join(f"c.{v.trait} = {want[v.name]!r}\n" for v in variables))
    got = settings(probe(tmp_path, [v.trait for v in variables], **REQUIRED, PDL_LOCAL_CONFIG=str(path)))
    assert {v.name: got[v.trait] for v in variables} == want
    # the deprecated name sets the new one
    assert settings(probe(tmp_path, ["SpawnerCore.default_workers"], **REQUIRED, PDL_DEFAULT_GPUS="2")) == {
        "SpawnerCore.default_workers": 2}


def test_the_data_and_docker_variables_reach_the_spawner_and_the_admin_view(tmp_path):
    got = settings(load_config(tmp_path, **REQUIRED, PDL_DATA_NFS="10.0.0.5:/export/data",
                               DOCKER_HOST="tcp://10.0.0.5:2375", PDL_NODES="gpu1"))
    assert got["admin_view"] == {"kind": "swarm", "state_db": str(tmp_path / "state" / "swarm.sqlite"),
                                 "docker_host": "tcp://10.0.0.5:2375", "nodes": ["gpu1"], "gpu_resource": None,
                                 "usage_db": str(tmp_path / "state" / "usage.sqlite")}
    assert refusal(load_config(tmp_path, **REQUIRED, PDL_DATA_NFS="a:/b", PDL_DATA_PATH="/srv/data")) == (
        "jupyterhub_config.py: set PDL_DATA_PATH or PDL_DATA_NFS, not both")


@pytest.mark.parametrize("env, line", [
    ({"PDL_HUB_CONNECT_IP": ""}, "jupyterhub_config.py: PDL_SPAWNER=swarm needs PDL_HUB_CONNECT_IP, this node's "
     "address as the other nodes reach it (e.g. -e PDL_HUB_CONNECT_IP=10.0.0.5)"),
    ({"PDL_HOMES_ROOT": "/srv/homes"}, "PDL_HOMES_ROOT does not apply to PDL_SPAWNER=swarm (its spawner has no "
     "HostServer.homes_root): unset it"),
    ({"PDL_POOL": "cpu:0"}, "PDL_POOL applies to PDL_SPAWNER=local only, and this hub's is swarm: unset it"),
    ({"PDL_HOME_STORAGE": "nfs"}, "PDL_HOME_STORAGE must be one of volume, path, got 'nfs'"),
])
def test_what_is_not_swarms_stops_the_hub_in_one_line(tmp_path, env, line):
    assert refusal(load_config(tmp_path, **{**REQUIRED, **env})) == line


def test_a_c_line_of_the_hubs_machine_is_refused_on_swarm(tmp_path):
    path = config_file(tmp_path / "etc")
    path.write_text("c.HostServer.homes_root = '/srv/homes'\n")
    assert refusal(load_config(tmp_path, **REQUIRED, PDL_LOCAL_CONFIG=str(path))) == (
        "c.HostServer does not apply to PDL_SPAWNER=swarm: its spawner, PDLSwarmSpawner, has no HostServer")


def test_the_servers_engine_host_leaves_the_engines_to_the_hub():
    """The kind's plug-in names the user's server's engine host (pdl_spawner/swarm/engine_host.py)."""
    from pdl.contract import ServerContract
    from pdl_server.engine_hosts import host_for
    from pdl_spawner.swarm.engine_host import SwarmServices

    host = host_for(ServerContract(kind="swarm", workers=3, controller_secret="/run/secrets/pdl-notebook.json"),
                    cluster=None)
    assert type(host) is SwarmServices and host.workers == 3


def test_the_hubs_own_api_listens_on_the_managers_cluster_address_not_where_the_proxy_does(tmp_path):
    """The servers and engines call the hub's API at ``PDL_HUB_CONNECT_IP``; the lab's
    interface, where the proxy serves users (here every interface), never carries it."""
    got = settings(probe(tmp_path, ["JupyterHub.hub_ip", "JupyterHub.hub_connect_ip", "JupyterHub.ip"],
                         **dict(REQUIRED, PDL_HUB_CONNECT_IP="10.0.0.5", PDL_HUB_IP="0.0.0.0")))
    assert got == {"JupyterHub.hub_ip": "10.0.0.5", "JupyterHub.hub_connect_ip": "10.0.0.5", "JupyterHub.ip": "0.0.0.0"}
