"""The lab reaches the hub by its name over HTTPS, from a machine of its own.

The hub runs in the root network namespace and listens on the lab's interface only
(``PDL_HUB_IP``, the veth to the laptop), with a certificate for ``hub.lab.test`` and
``*.hub.lab.test`` from a CA the test makes. "The user's laptop" is a network namespace
whose hosts file alone gives it those names, and whose Chromium trusts that CA (its NSS
database): nothing ignores a certificate error. Ann logs in at https://hub.lab.test,
spawns 2 workers, reaches her server at https://ann.hub.lab.test and runs a
``%%distributed -n 2`` cell, whose output arrives through the kernel's WebSocket.
"""

from __future__ import annotations

import contextlib

import pytest

import host_names
from hub_harness import free_port, hub_fixture
from lab_access import HOST, URL, check_https_all_the_way, train_from_the_laptop
from lab_access import ca, laptop  # noqa: F401 (the module's fixtures)
from nginx_front import nginx_in_front

pytestmark = pytest.mark.browser

#: The two ways in: the hub serves HTTPS itself, or the lab's nginx does in front of it.
WAYS = ("the-hub-serves-tls", "nginx-in-front")


@pytest.fixture(scope="module", params=WAYS)
def hub(request, tmp_path_factory, ca, laptop):
    root = tmp_path_factory.mktemp("lab-hub")
    issued = ca.issue([HOST, f"*.{HOST}"])
    host_names.register(HOST, laptop.hub_addr)  # the tests' own calls, as the lab's DNS would
    with pytest.MonkeyPatch.context() as env, contextlib.ExitStack() as stack:
        env.setenv("REQUESTS_CA_BUNDLE", str(ca.pem))  # the tests' own calls trust the lab's CA too
        common = {"PDL_HSTS_S": "600"}
        if request.param == "the-hub-serves-tls":
            way = dict(common, PDL_HUB_IP=laptop.hub_addr, PDL_TLS_CERT=str(issued.cert),
                       PDL_TLS_KEY=str(issued.key), PDL_HTTP_PORT="80")
            port = None
        else:  # the hub on loopback, plain HTTP, behind the docs' nginx recipe
            port = free_port()
            stack.enter_context(nginx_in_front(root, laptop.hub_addr, HOST, issued.cert, issued.key, port))
            way = dict(common, PDL_TLS_PROXY="127.0.0.1")
        try:
            yield from hub_fixture(root, ["admin", "ann"], ["cpu:0", "cpu:1"], public_url=URL, port=port, hub_env=way)
        finally:
            host_names.unregister(HOST)


def test_ann_logs_in_at_the_labs_name_over_https_and_her_cell_runs_on_two_engines(hub, laptop, tmp_path):
    visit = train_from_the_laptop(laptop, hub, "ann", 2, tmp_path)
    assert sorted(hub.reservations().values()) == ["ann", "ann"]
    check_https_all_the_way(visit, hub, 2, hsts="max-age=600; includeSubDomains")


def test_from_the_laptop_only_the_public_ports_answer(hub, laptop):
    """The proxy's API, the hub's own API and the admin view stay on loopback (and, behind
    nginx, the hub's public port too): the lab's interface carries HTTPS and the redirect
    of plain HTTP, nothing else."""
    assert laptop.can_connect(443) and laptop.can_connect(80)
    inside = [hub.proxy_api_port, hub.internal_port, hub.admin_view_port] + ([hub.port] if hub.port != 443 else [])
    assert [port for port in inside if laptop.can_connect(port)] == [], "answers on the lab's interface"
