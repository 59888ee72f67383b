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

import os
import tempfile
from pathlib import Path

import pytest

import host_names
from worker_groups import group_order, group_seconds, worker_group

#: As root, the tests' temporary folders (pytest's ``tmp_path``, :mod:`tempfile`'s), outside
#: /tmp and /var/tmp: each user's server sees those of its own (pdl_spawner/host/private_tmp.py),
#: never the machine's, and the tests hand servers folders they made (stand-in GPUs, data
#: sets). Outside the repository too: the GPU check's tests tell its copy of PDL from the
#: repository's by where it lies.
TESTS_TMP = Path("/var/lib/pdl-tests/tmp")
if os.geteuid() == 0:
    TESTS_TMP.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(TESTS_TMP)
    tempfile.tempdir = None  # tempfile reads TMPDIR again



@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """As root, each session's own base temp folder (``harness/session_tmp.py``): a session
    started beside another never removes the other's folders. Not for xdist's workers
    (theirs is below their controller's) nor where ``--basetemp`` is given."""
    if os.geteuid() == 0 and not config.option.basetemp and not hasattr(config, "workerinput"):
        from session_tmp import session_basetemp

        config.option.basetemp = str(session_basetemp(TESTS_TMP / "sessions"))


# each user's server is an origin of its own, <name>.localhost: resolve it as browsers do
host_names.install()

# CPU seconds a test, with PDL_CPU_PROFILE set (harness/cpu_profile.py)
pytest_plugins = ("cpu_profile",)


def pytest_collection_modifyitems(config, items):
    """The tests by group (``harness/worker_groups.py``), the groups in
    :func:`~worker_groups.group_order`, each group's tests in their own order. Each test's
    group is recorded in the JUnit XML (a ``worker_group`` property): ``scripts/test_report.py
    --group-seconds`` sums the groups' seconds from it, for tests/group_seconds.json."""
    groups = {item.nodeid: worker_group(item.nodeid) for item in items}
    order = group_order(list(dict.fromkeys(groups.values())), group_seconds())
    rank = {group: i for i, group in enumerate(order)}
    items.sort(key=lambda item: rank[groups[item.nodeid]])
    for item in items:
        item.user_properties.append(("worker_group", groups[item.nodeid]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with :func:`~worker_groups.worker_group` as the scope, taken in
    collection order."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False
    return WorkerGroups(config, log)


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
