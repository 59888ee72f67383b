"""The simulated Slurm cluster's fixtures. ``slurm``: the simulated 3-node Slurm cluster
(tests/harness/slurm_harness.py), shared by the whole session; ``clean_slurm``: the same,
with every job cancelled after the test. A failing test's report shows the daemons'
logs and the queue (tests/conftest.py, ``SlurmSim.failure_sections``)."""

from __future__ import annotations

import pytest

import slurm_harness

#: The first test that uses the cluster may also install Slurm (scripts/slurm-up: apt).
SLURM_TEST_TIMEOUT = 900


@pytest.fixture(scope="session")
def slurm():
    """A running :class:`slurm_harness.SlurmSim`: controller ``ctl``, nodes ``n1..n3``
    with one GPU each, test users ``pdl-sl-ann`` and ``pdl-sl-ben``. Skips when this
    machine can't run it (not root, no network namespaces), except with $CI set, where
    that fails."""
    yield from slurm_harness.slurm_session()


@pytest.fixture
def clean_slurm(slurm):
    """``slurm``, with every job cancelled and every node idle again after the test."""
    yield slurm
    slurm.reset()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slurm" in item.fixturenames and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLURM_TEST_TIMEOUT))
