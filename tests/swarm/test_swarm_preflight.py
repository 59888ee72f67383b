"""The preflight on the simulated 3-node swarm: one node's engine gets a network
interface that does not exist there (as a wrong admin setting would give it); the
first distributed cell stops, naming that node and the reason, and `%pdl check`
shows it in the table."""

from __future__ import annotations

import re

import pytest

from hub_harness import Kernel
from swarm_hub_harness import swarm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.docker

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory):
    yield from swarm_hub_fixture(tmp_path_factory.mktemp("swarm-preflight"), swarm, ["admin", "alice"])


def engine_task_container(swarm, service: str):
    """(hostname of its node, running container) of an engine service's task, or None."""
    for i in swarm.node_ids():
        found = swarm.containers(i, label=f"com.docker.swarm.service.name={service}")
        if found:
            return swarm.hostname(i), found[0]
    return None


def test_a_node_with_a_missing_interface_is_named_before_anything_runs(hub, swarm):
    r = hub.spawn("alice", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice", timeout=240)
    try:
        # plant the fault: engine 1 is told to use an interface its node does not have
        service = swarm.manager.services.get("pdl-alice-engine-1")
        before = engine_task_container(swarm, service.name)[1].id
        env = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"].get("Env") or []
        service.update(env=[*env, "GLOO_SOCKET_IFNAME=bogus0"])
        found = wait_until(lambda: (f := engine_task_container(swarm, service.name)) and f[1].id != before and f,
                           90, what="the engine to restart with the planted setting")
        node = found[0]

        kernel = Kernel(hub, "alice")
        try:
            assert kernel.execute("%load_ext pdl_magics")["error"] is None
            marker = "/tmp/pdl-preflight-ran"
            out = kernel.execute(f"%%distributed -n 3\nopen({marker!r}, 'w').write('ran')", timeout=300)
            assert out["error"] is not None, out
            shown = ANSI.sub("", "\n".join(out["error"]["traceback"]))
            assert f"on {node}: interface bogus0 (GLOO_SOCKET_IFNAME) does not exist" in shown, shown
            assert "The cell did not run." in shown
            checked = kernel.execute("%pdl check -n 3", timeout=300)
            table = ANSI.sub("", checked["stdout"] + "\n".join((checked["error"] or {}).get("traceback", [])))
            assert "bogus0" in table and node in table, checked
        finally:
            kernel.close()
        # the marker would be in some engine's container: none has it
        for i in swarm.node_ids():
            for c in swarm.containers(i, name="pdl-alice"):
                assert c.exec_run(["test", "-e", marker]).exit_code != 0, f"the cell ran on {swarm.hostname(i)}"
    finally:
        hub.api("DELETE", "/users/alice/server")
        wait_until(lambda: not hub.running_servers(), 90, what="alice's server to stop")
