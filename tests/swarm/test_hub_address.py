"""Where the hub's proxy listens on a Swarm manager (pdl_spawner/swarm/hub_address.py): an
address JupyterHub can check even where the host's name does not resolve."""

from __future__ import annotations

import pytest

from pdl_spawner.swarm.hub_address import proxy_ip, resolves

pytestmark = pytest.mark.unit

CONNECT = "10.0.0.5"


def nowhere(name: str) -> bool:
    """The lookup on a host whose name resolves nowhere (the hub's container on a node)."""
    return False


def test_every_interface_where_the_name_resolves_else_the_managers_address():
    assert resolves("localhost")
    assert proxy_ip(None, CONNECT, hostname="localhost") == "0.0.0.0"
    assert proxy_ip("", CONNECT, hostname="pdl-node1", resolve=nowhere) == CONNECT
    assert proxy_ip(None, CONNECT, hostname="pdl-node1", resolve=nowhere) == CONNECT


def test_an_address_the_admin_sets_is_kept():
    assert proxy_ip("10.0.0.9", CONNECT, hostname="pdl-node1", resolve=nowhere) == "10.0.0.9"
    assert proxy_ip("0.0.0.0", CONNECT, hostname="localhost") == "0.0.0.0"


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_every_interface_on_a_name_that_does_not_resolve_is_one_line_naming_what_to_set(wildcard):
    with pytest.raises(ValueError) as e:
        proxy_ip(wildcard, CONNECT, hostname="pdl-node1", resolve=nowhere)
    message = str(e.value)
    assert "\n" not in message and "'pdl-node1', which does not resolve" in message
    assert f"set PDL_HUB_IP to an address of this host (e.g. PDL_HUB_IP={CONNECT}" in message
