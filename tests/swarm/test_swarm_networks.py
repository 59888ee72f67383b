"""Which private network a new server gets (pure part of :mod:`pdl_spawner.swarm.networks`).

The pool itself, the keeper and the isolation they give run on the simulated swarm in
``tests/swarm/test_swarm_neighbours.py``.
"""

from __future__ import annotations

import pytest

from pdl_spawner.swarm.networks import NoFreeNetwork, free_network, pool_names

pytestmark = pytest.mark.unit


def notebook_on(network: str | None) -> dict:
    labels = {"pdl.role": "notebook"}
    if network is not None:
        labels["pdl.network"] = network
    return {"Spec": {"Labels": labels}}


def test_a_network_named_by_a_notebook_or_claimed_by_a_spawn_is_never_handed_out_again():
    names = pool_names(3)
    assert names == ["pdl-private-0", "pdl-private-1", "pdl-private-2"]
    assert free_network(names, [], set()) == "pdl-private-0"
    assert free_network(names, [notebook_on("pdl-private-0")], {"pdl-private-1"}) == "pdl-private-2"
    # a notebook of an older PDL (no label) takes none
    assert free_network(names, [notebook_on(None)], set()) == "pdl-private-0"
    assert free_network(names, [notebook_on("pdl-private-0"), notebook_on("pdl-private-2")],
                        {"pdl-private-1"}) is None


def test_a_full_pool_says_in_one_line_what_the_admin_can_do():
    message = str(NoFreeNetwork(16))
    assert "\n" not in message
    assert message == ("No private network is free for your server (0 of 16 are free); try again when a "
        "server stops, or ask the admin to raise PDLSwarmSpawner.private_networks")
