"""The GPU type at spawn on the simulated Slurm cluster, whose nodes have two kinds of GPU
(GRES ``gpu:a100`` on n1 and n2, ``gpu:t4`` on n3): the spawn form offers each type with
its free count, the job asks Slurm for that type (Slurm's refusal names it), a type the
cluster lacks is refused in one line, and the panel and the admin view name the type."""

from __future__ import annotations

import pytest

from hub_harness import admin_status, gpu_type_choices
from slurm_hub_harness import slurm_hub_fixture
from waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory):
    yield from slurm_hub_fixture(tmp_path_factory.mktemp("slurm-gpu-types"), slurm, ["admin", "ann", "ben"])


def test_each_gpu_type_is_offered_with_its_free_count_and_reserved_as_chosen(hub, slurm):
    assert gpu_type_choices(hub, "ann") == {"": "Any type (3 of 3 free)", "a100": "a100 (2 of 2 free)",
                                            "t4": "t4 (1 of 1 free)"}

    r = hub.api("POST", "/users/ann/server", json={"workers": 1, "gpu_type": "h100"})
    assert r.status_code == 400, r.text
    assert "gpu_type must be one of 'a100', 't4', or '' for any, got 'h100'" in r.json()["message"]
    assert not hub.pdl_jobs("ann")

    try:
        assert hub.api("POST", "/users/ann/server", json={"workers": 1, "gpu_type": "t4"}).status_code in (201, 202)
        hub.wait_ready("ann", timeout=120)
        [anns] = hub.pdl_jobs("ann")
        assert anns["nodelist"] == "n3", anns  # the t4 node
        cluster = hub.server_api("ann", "/pdl/api/cluster")
        assert cluster["gpu_type"] == "t4", cluster  # the panel says "Reserved: 1 t4 GPUs (gpu:0)"

        choices = gpu_type_choices(hub, "ben")
        assert (choices["t4"], choices["a100"]) == ("t4 (0 of 1 free)", "a100 (2 of 2 free)")
        r = hub.api("POST", "/users/ben/server", json={"workers": 1, "gpu_type": "t4"})
        assert r.status_code == 409, r.text
        assert r.json()["message"].startswith("Slurm cannot start 1 t4 GPU(s) for you now (reason Resources)"), r.text
        wait_until(lambda: not hub.pdl_jobs("ben"), 30, what=lambda: f"ben's refused job to go: {slurm.jobs()}")

        assert hub.api("POST", "/users/ben/server", json={"workers": 2, "gpu_type": "a100"}).status_code in (201, 202)
        hub.wait_ready("ben", timeout=120)
        [bens] = hub.pdl_jobs("ben")
        assert bens["nodelist"] == "n[1-2]", bens

        rows = {(r["owner"], r["node"], r["gpu_type"]) for r in admin_status(hub)["reservations"]}
        assert rows == {("ann", "n3", "t4"), ("ben", "n1", "a100"), ("ben", "n2", "a100")}, rows
    finally:
        hub.api("DELETE", "/users/ann/server")
        hub.api("DELETE", "/users/ben/server")
    hub.wait_no_pdl_jobs()
