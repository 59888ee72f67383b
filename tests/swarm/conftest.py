"""The simulated Swarm's fixtures. ``swarm``: the simulated 3-node Docker Swarm
(tests/harness/swarm_harness.py), shared by the whole session."""

from __future__ import annotations

import pytest

import swarm_harness

#: The first test that uses the swarm also builds the images and starts the nodes.
SWARM_TEST_TIMEOUT = 1800


@pytest.fixture(scope="session")
def swarm():
    """A running :class:`swarm_harness.SwarmSim` with pdl-notebook:test and pdl-hub:test
    loaded on every node. Skips when this machine can't run it (not root, no Docker),
    except with $CI set, where that fails. Tests clean up their own services (or use
    ``clean_swarm``)."""
    yield from swarm_harness.swarm_session()


@pytest.fixture
def clean_swarm(swarm):
    """``swarm``, with every service, container and network removed after the test."""
    yield swarm
    swarm.reset()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "swarm" in item.fixturenames and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SWARM_TEST_TIMEOUT))
