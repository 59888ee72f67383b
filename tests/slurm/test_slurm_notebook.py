"""The CINIC-10 notebook, unchanged, on the simulated Slurm cluster through a real hub:
it trains across the three nodes' job steps; a failing rank's traceback, Ctrl-C and the
engines' state afterwards work as on the embedded default; the preflight, the Cluster
panel and the admin view show Slurm's nodes, and the admin view Slurm's queue."""

from __future__ import annotations

import pytest

from hub_harness import Progress, admin_status
from notebook_run import check_notebook, small_run_env
from slurm_hub_harness import slurm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-notebook")
    yield from slurm_hub_fixture(root, slurm, ["admin", "ann", "ben"],
                                 spawner_env=small_run_env(str(root / "no-cinic10-here")))


def test_the_cinic10_notebook_trains_across_the_nodes_and_recovers_from_failures(hub, slurm):
    r = hub.spawn("ann", 3)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", timeout=120)
    [job] = hub.pdl_jobs("ann")

    def preflight_shows_the_nodes(kernel):
        checked = kernel.execute("%pdl check -n 3", timeout=300)
        assert checked["error"] is None, checked
        rows = [line.split() for line in checked["display"].splitlines()[2:] if line.strip()]
        assert sorted(row[1] for row in rows) == ["n1", "n2", "n3"] and all(row[-1] == "✓" for row in rows), checked

    check_notebook(hub, "ann", then=preflight_shows_the_nodes)

    def panel():  # what her Cluster panel shows, once each engine has said where it runs
        seen = hub.server_api("ann", "/pdl/api/cluster")
        return seen if len(seen["engines"]) == 3 and all(e["host"] for e in seen["engines"]) else None

    shown = wait_until(panel, 30, what="the Cluster panel to list 3 engines")
    assert shown["nodes"] == ["n1", "n2", "n3"] and shown["message"] is None, shown

    # the admin view reads Slurm: ann's GPUs on each node, ben's job waiting with Slurm's reason
    r = hub.api("POST", "/users/ben/server", json={"workers": 1, "queue": True})
    assert r.status_code in (201, 202), r.text
    progress = Progress(hub, "ben")
    wait_until(lambda: progress.saw("reason Resources"), 60, what=lambda: f"ben waiting: {progress.messages}")
    status = admin_status(hub)
    assert status["source"] == "slurm" and status["free"] == [], status
    held = sorted((row["node"], row["user"], row["job"]) for row in status["reservations"])
    assert held == [(node, "ann", int(job["id"])) for node in ("n1", "n2", "n3")], status
    [waiting] = status["queue"]
    assert (waiting["user"], waiting["gpus"], waiting["reason"], waiting["position"]) == ("ben", 1, "Resources", 1)
    hub.api("DELETE", "/users/ben/server")
    hub.api("DELETE", "/users/ann/server")
    hub.wait_no_pdl_jobs()
    assert not (hub.state_dir / "reservations.sqlite").exists(), "PDL kept a ledger of its own beside Slurm"
