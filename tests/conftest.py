"""What the tests of every side share.

The tests are in one folder per part of the code they guard: a cluster kind's
(``swarm/``, ``slurm/``: everything of that kind), else a side's (``hub/``, ``server/``,
``notebook/``, ``engines/``, ``training/``, ``browser/``; tests/test_layout.py keeps it so); fixtures that only one side uses are in that folder's ``conftest.py``. The tiers
are markers (pyproject.toml). The harness modules in ``harness/`` are importable from
every folder (``pythonpath`` in pyproject.toml).

Here: the tests' clients resolve ``*.localhost`` as browsers do (``harness/host_names.py``);
``pdl_session``, a local cluster of three CPU-slot engines for a module; and
the services' logs added to a failing test's report: the hub's and its servers' for a
test that uses a hub fixture, the node daemons' for one on the simulated swarm, the
Slurm daemons' (and the queue) for one on the simulated Slurm cluster.
"""

from __future__ import annotations

import pytest

import host_names

# each user's server is an origin of its own, <name>.localhost: resolve it as browsers do
host_names.install()


#: The machine-wide resources that tests share, each with the fixtures through which a
#: test uses it: the tests of one never run at the same time, since pytest-xdist's
#: ``--dist loadgroup`` (scripts/test) gives all of a group to one worker. Every other
#: resource a test uses is its own (ports, Unix accounts under its hub's prefix, a state
#: folder under its tmp_path, the servers' ports of its worker: ``hub_harness.server_ports``).
MACHINE_WIDE = {
    "swarm": {"swarm"},  # the simulated swarm: its namespaces, daemons and images (tests/swarm/conftest.py)
    "slurm": {"slurm"},  # the simulated Slurm cluster, its namespaces and Unix accounts (tests/slurm/conftest.py)
}


def worker_group(item: pytest.Item) -> str | None:
    """The group whose tests run in one worker, one after another (see scripts/test), or
    None for a test that may run in any: the machine-wide resource it uses
    (:data:`MACHINE_WIDE`), else its module where it uses a set-up made once per module
    (a module-scoped fixture: a hub, a cluster of engines), so that it is made once."""
    used = set(getattr(item, "fixturenames", ()))
    resource = next((name for name, fixtures in MACHINE_WIDE.items() if used & fixtures), None)
    if resource:
        return resource
    definitions = getattr(item, "_fixtureinfo", None)
    for name in used:
        for fixture in (definitions.name2fixturedefs.get(name, ()) if definitions else ()):
            if fixture.scope in ("module", "package"):
                return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = worker_group(item)
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="module")
def pdl_session(tmp_path_factory):
    """A DistributedSession over three local CPU slots (``engines_harness.SLOTS``),
    engines already started, for one test module (``engines_harness.local_session``)."""
    import engines_harness

    yield from engines_harness.local_session(tmp_path_factory)


def service_logs(funcargs: dict) -> list[tuple[str, str]]:
    """(title, text) for each service log a failing test's report shows: those of every
    simulated swarm, Slurm cluster and hub among the fixtures it used (``failure_sections()``)."""
    from hub_harness import Hub
    from slurm_harness import SlurmSim
    from swarm_harness import SwarmSim

    sections, seen = [], set()
    for name, service in funcargs.items():
        if isinstance(service, (SwarmSim, SlurmSim, Hub)) and id(service) not in seen:  # clean_x is x
            seen.add(id(service))
            try:
                sections += service.failure_sections()
            except Exception as e:  # noqa: BLE001 - a log that cannot be read must not hide the failure
                sections.append((f"{name} logs", f"could not read them: {type(e).__name__}: {e}"))
    return sections


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and hasattr(item, "funcargs"):
        report.sections.extend(service_logs(item.funcargs))
