"""Shared fixtures. ``swarm``: the simulated 3-node Docker Swarm (tests/swarm_harness.py)."""

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    sim = item.funcargs.get("swarm") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(sim, swarm_harness.SwarmSim):
        report.sections.append(("swarm node daemons", sim.logs(tail=40)))
