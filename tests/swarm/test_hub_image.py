"""Replicate on another cluster exactly as the README says, on the simulated swarm.

The hub *image* is started by the README's own ``docker run`` command (read from
README.md; only the registry, the addresses and the socket's host path change:
tests/harness/hub_image_harness.py) on node1, the manager, whose host name resolves
nowhere. The admin logs in and asks for 3 GPUs in a real browser, trains across the
three nodes from a notebook's kernel, and then the hub is upgraded in place as the
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

from browser_harness import chromium_page
from hub_harness import REPO, Kernel, running
from hub_image_harness import CONTAINER, ImageHub
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
def hub(swarm, tmp_path_factory):
    with running(ImageHub(tmp_path_factory.mktemp("hub-image"), swarm, hub_image="pdl-hub:test")) as hub:
        yield hub


def engine_tasks(swarm, user: str) -> dict[str, str]:
    """task id -> node hostname of ``user``'s running engine tasks."""
    hosts = swarm.hostnames_by_node_id()
    return {t["ID"]: hosts[t["NodeID"]]
            for s in swarm.manager.services.list(filters={"label": [f"pdl.user={user}", "pdl.role=engine"]})
            for t in s.tasks(filters={"desired-state": "running"})}


def test_the_readmes_command_trains_across_three_nodes_and_upgrades_in_place(hub, swarm, release_image, tmp_path):
    admin = hub.users[0]
    assert hub.shell(f"docker exec {CONTAINER} hostname").stdout.strip() == swarm.hostname(1)

    # log in and ask for 3 GPUs, in a browser
    with chromium_page(tmp_path) as page:
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", admin)
        page.fill("#password_input", hub.password(admin))
        page.click("#login_submit")
        page.wait_for_url("**/hub/spawn**", timeout=30_000)
        assert "3 of 3 GPUs free" in page.inner_text("form")
        page.fill("input[name=workers]", "3")
        page.click("form [type=submit]")
        page.wait_for_url(f"**/user/{admin}/lab**", timeout=300_000)
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
    assert hub.server_ready(admin)
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
