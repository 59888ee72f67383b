"""The lab reaches a Slurm cluster's hub by its name over HTTPS, from a laptop.

The hub runs on the login node (the root namespace) with ``PDL_SPAWNER=slurm`` and
``PDL_SLURM_SERVER=allocation``: each user's server is a step of their own job on a
compute node, reached by the hub's proxy on the cluster's network. The proxy serves
HTTPS with a certificate for ``hub.lab.test`` and ``*.hub.lab.test`` (a CA the test
makes) on the login node's lab interface only (``PDL_HUB_IP``: the veth to "the user's
laptop", a network namespace whose hosts file alone gives it those names and whose
Chromium trusts that CA, tests/harness/laptop.py). Ann opens ``http://hub.lab.test``, is
sent to HTTPS, logs in, asks for 2 GPUs and runs a ``%%distributed -n 2`` cell across
them in a notebook at ``https://ann.hub.lab.test``.
"""

from __future__ import annotations

import pytest

import host_names
from lab_access import HOST, URL, check_https_all_the_way, train_from_the_laptop
from lab_access import ca, laptop  # noqa: F401 (the module's fixtures)
from slurm_hub_harness import slurm_engines, slurm_hub_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.browser]


@pytest.fixture(scope="module")
def hub(slurm, tmp_path_factory, ca, laptop):
    issued = ca.issue([HOST, f"*.{HOST}"])
    host_names.register(HOST, laptop.hub_addr)  # the tests' own calls, as the lab's DNS would
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("REQUESTS_CA_BUNDLE", str(ca.pem))  # the tests' own calls trust the lab's CA too
            yield from slurm_hub_fixture(
                tmp_path_factory.mktemp("slurm-lab-access"), slurm, ["admin", "ann"], public_url=URL,
                hub_env={"PDL_SLURM_SERVER": "allocation", "PDL_HUB_IP": laptop.hub_addr,
                         "PDL_TLS_CERT": str(issued.cert), "PDL_TLS_KEY": str(issued.key)})
    finally:
        host_names.unregister(HOST)


def test_ann_trains_on_two_compute_nodes_from_her_laptop_over_https(hub, laptop, slurm, tmp_path):
    visit = train_from_the_laptop(laptop, hub, "ann", 2, tmp_path)
    check_https_all_the_way(visit, hub, 2)
    (job,) = hub.pdl_jobs("ann")
    engines = [e for e in slurm_engines(hub.root).values() if e["SLURM_JOB_ID"] == job["id"]]
    assert len(engines) == 2 and job["nodes"] == "2", (job, engines)  # one GPU a node


def test_from_the_laptop_only_https_and_its_redirect_answer(hub, laptop):
    """The login node's lab interface carries HTTPS and the redirect of plain HTTP; the
    proxy's API and the admin view stay on loopback, the hub's own API on the cluster's
    network (``PDL_CONTROLLER_IP``), where the servers on the compute nodes call it."""
    assert laptop.can_connect(443) and laptop.can_connect(80)
    inside = [hub.proxy_api_port, hub.internal_port, hub.admin_view_port]
    assert [port for port in inside if laptop.can_connect(port)] == [], "answers on the lab's interface"
