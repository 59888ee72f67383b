"""Replicate on another cluster exactly as the README says, on the simulated swarm.

The hub *image* is started by the README's own ``docker run`` command (read from
README.md; only the registry, the addresses, the certificate's folder and the socket's
host path change: tests/harness/hub_image_harness.py) on node1, the manager, whose host
name resolves nowhere; it serves HTTPS with a certificate of a CA the test makes. From
"her laptop", a network namespace on the swarm's network whose hosts file alone gives it
the hub's names and whose Chromium trusts that CA (tests/harness/laptop.py), the admin
opens the hub's name over plain HTTP, is sent to HTTPS, logs in, asks for 3 GPUs and runs
a ``%%distributed -n 3`` cell in a notebook; she trains across the three nodes from a
notebook's kernel, and then the hub is upgraded in place as the
README says: its container replaced by the release build of the hub image
(scripts/release-images, as the release workflow runs it) on the same state volume,
while a cell runs. The server, its engines (the same tasks), the GPU reservation and
the kernel's variables are all still there afterwards, and the running cell finished.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hub_harness import REPO, Kernel, running
from hub_image_harness import CONTAINER, PUBLIC_NAME, ImageHub
from lab_access import check_https_all_the_way, train_from_the_laptop
from lab_tls import TestCA
from laptop import OnBridge, laptop as laptop_namespace, worker_index
from swarm_harness import HOST_DOCKER
from swarm_hub_harness import DDP_CELL, DDP_RESULT, pdl_objects

pytestmark = [pytest.mark.docker, pytest.mark.browser]

#: The "registry" of the release build (the tests push nowhere).
RELEASE_PREFIX = "pdl-e2e"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: Seconds the cell that runs across the upgrade sleeps: the old hub stops within it.
RUNNING_CELL_S = 60


@pytest.fixture(scope="module")
def release_image(swarm):
    """The hub image as a release builds it (scripts/release-images), kept here and
    loaded on the nodes; on the sim's local base image, as scripts/build-images builds."""
    args = ["--network", "host", "--build-arg", "HUB_BASE=pdl-base:bookworm",
            "--build-arg", "NOTEBOOK_BASE=pdl-base:bookworm"]
    if CA_BUNDLE.is_file():
        args += ["--secret", f"id=ca,src={CA_BUNDLE}"]
    env = {**os.environ, "PDL_PUSH": "0", "PDL_TARGETS": "hub", "PDL_DOCKER": HOST_DOCKER,
           "PDL_BUILD_ARGS": " ".join(args)}
    r = subprocess.run(["bash", "scripts/release-images", RELEASE_PREFIX], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    version = re.search(r'^version = "(.*)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    tag = f"{RELEASE_PREFIX}/pdl-hub:{version}"
    labels = subprocess.run([HOST_DOCKER, "image", "inspect", "-f", "{{json .Config.Labels}}", tag],
                            capture_output=True, text=True, check=True).stdout
    assert f'"org.opencontainers.image.version":"{version}"' in labels, labels
    swarm.load_images(tag)
    return tag


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCA(tmp_path_factory.mktemp("lab-ca"))


@pytest.fixture(scope="module")
def hub(swarm, tmp_path_factory, ca):
    tls = ca.issue([PUBLIC_NAME, f"*.{PUBLIC_NAME}"])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("REQUESTS_CA_BUNDLE", str(ca.pem))  # the tests' own calls trust the lab's CA
        with running(ImageHub(tmp_path_factory.mktemp("hub-image"), swarm, hub_image="pdl-hub:test",
                              tls=tls)) as hub:
            yield hub


@pytest.fixture(scope="module")
def laptop(swarm, hub, ca, tmp_path_factory):
    """The admin's laptop on the swarm's network (10.77.0.50 and up), the manager its hub."""
    on_bridge = OnBridge(swarm.bridge_ns, f"{swarm.SUBNET}.{50 + worker_index()}", swarm.node_addr(1))
    with laptop_namespace(tmp_path_factory.mktemp("laptop"), [PUBLIC_NAME, f"{hub.users[0]}.{PUBLIC_NAME}"], ca.pem,
                          on_bridge) as machine:
        yield machine


def engine_tasks(swarm, user: str) -> dict[str, str]:
    """task id -> node hostname of ``user``'s running engine tasks."""
    hosts = swarm.hostnames_by_node_id()
    return {t["ID"]: hosts[t["NodeID"]]
            for s in swarm.manager.services.list(filters={"label": [f"pdl.user={user}", "pdl.role=engine"]})
            for t in s.tasks(filters={"desired-state": "running"})}


def test_the_readmes_command_trains_across_three_nodes_and_upgrades_in_place(hub, swarm, laptop, release_image,
                                                                               tmp_path):
    admin = hub.users[0]
    assert hub.shell(f"docker exec {CONTAINER} hostname").stdout.strip() == swarm.hostname(1)

    # from her laptop: http:// sent to https, log in, ask for 3 GPUs, a cell on them in a notebook
    visit = train_from_the_laptop(laptop, hub, admin, 3, tmp_path)
    assert "3 of 3 GPUs free" in visit.spawn_form
    check_https_all_the_way(visit, hub, 3)
    services, _ = pdl_objects(swarm, admin)
    assert services == [f"pdl-{admin}", *(f"pdl-{admin}-engine-{i}" for i in range(3))]
    tasks = engine_tasks(swarm, admin)
    assert sorted(tasks.values()) == [swarm.hostname(i) for i in swarm.node_ids()]

    # train across the three nodes; no warning the user cannot act on
    kernel = Kernel(hub, admin)
    try:
        assert kernel.execute("%load_ext pdl_magics")["error"] is None
        out = kernel.execute(DDP_CELL, timeout=300)
        assert out["error"] is None, f"{out}\n{hub.log_tail()}"
        assert "Warning" not in out["stdout"] + out["stderr"], out
        ranks = {int(m[0]): m[1:] for m in DDP_RESULT.findall(out["stdout"])}
        assert sorted(ranks) == [0, 1, 2], out["stdout"]
        assert sorted(host for host, *_ in ranks.values()) == [swarm.hostname(i) for i in swarm.node_ids()]
        assert sorted(gpu for _, gpu, *_ in ranks.values()) == [swarm.gpu(i) for i in swarm.node_ids()]
        assert len({weights for *_, weights in ranks.values()}) == 1, "DDP replicas diverged"
        assert kernel.execute("%%distributed -n 3\nkept = 100 + rank")["error"] is None
        # a cell that runs while the hub is replaced (the browser tab goes; the kernel stays)
        kernel.send(f"%%distributed -n 3\nimport time\ntime.sleep({RUNNING_CELL_S})\nfinished = 1000 + rank")
        sent = time.monotonic()
    finally:
        kernel.detach()

    # upgrade in place, as the README says: the same command, the newer tag, the same volume
    hub.stop_hub()
    assert time.monotonic() - sent < RUNNING_CELL_S, "the hub was not stopped while the cell ran"
    hub.start(release_image)
    image = hub.shell(f"docker inspect -f '{{{{.Config.Image}}}}' {CONTAINER}").stdout.strip()
    assert image == release_image
    # the new hub takes her server back in the background once its init_spawners_timeout
    # (10 s) has passed: its check of the server, which asks the hub's API not yet up,
    # answers 503 until then, and JupyterHub retries it within its http_timeout (30 s)
    hub.wait_ready(admin, timeout=60)
    assert engine_tasks(swarm, admin) == tasks, "the engines were restarted"
    r = hub.spawn("bob", 1)
    assert r.status_code == 409 and "0 of 3 are free" in r.json()["message"], r.text

    again = Kernel(hub, admin, kernel_id=kernel.id)
    try:
        out = again.execute("%%distributed -n 3 --all-output\nprint('rank', rank, kept, finished)",
                            timeout=RUNNING_CELL_S + 120)
    finally:
        again.close()
    assert out["error"] is None, out
    seen = sorted(re.findall(r"rank (\d) (\d+) (\d+)", out["stdout"]))
    assert seen == [(str(r), str(100 + r), str(1000 + r)) for r in range(3)], out["stdout"]


def test_from_the_laptop_the_proxys_api_and_the_admin_view_do_not_answer(hub, laptop):
    """On the manager, the lab's users reach HTTPS and the redirect of plain HTTP; the
    proxy's API and the admin view stay on its loopback."""
    from pdl_spawner.settings.variables import VARIABLES

    inside = [int(v.default) for v in VARIABLES if v.name in ("PDL_PROXY_API_PORT", "PDL_ADMIN_VIEW_PORT")]
    assert len(inside) == 2 and laptop.can_connect(443) and laptop.can_connect(80)
    assert [port for port in inside if laptop.can_connect(port)] == [], "answers on the manager's network"
