"""Which tests run in one process, one after another, when the suite runs side by side
(scripts/test: pytest-xdist, ``--dist loadscope``), and in which order the processes
get those groups (tests/conftest.py uses both).

- :func:`worker_group`: a folder whose tests share a machine-wide resource
  (:data:`MACHINE_WIDE`) is one group; any other test's group is its module, so that a
  set-up made once per module (a hub, a cluster of engines) is made once.
- :func:`group_order`: the machine-wide groups first, then the others longest first by
  the seconds an earlier whole run measured (:data:`GROUP_SECONDS_FILE`): a long group
  handed out last would run alone at the end while the other processes wait.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The folders whose tests share a machine-wide resource (a cluster kind's simulated
#: cluster: its namespaces, daemons, Unix accounts and images, started once a session).
MACHINE_WIDE = {
    "tests/swarm/": "the simulated swarm (tests/swarm/conftest.py)",
    "tests/slurm/": "the simulated Slurm cluster (tests/slurm/conftest.py)",
}

#: Seconds each group's tests took in a whole run (``scripts/test`` writes them to
#: ``.pdl/test-reports/group-seconds.json`` after each run; copy that file here to refresh).
GROUP_SECONDS_FILE = Path(__file__).resolve().parent.parent / "group_seconds.json"
#: Seconds assumed for a group the file does not know yet (a new module).
NEW_GROUP_S = 30.0


def machine_wide_folder(nodeid: str) -> str | None:
    """The :data:`MACHINE_WIDE` folder the test ``nodeid`` is in, or None."""
    return next((folder for folder in MACHINE_WIDE if nodeid.startswith(folder)), None)


def worker_group(nodeid: str) -> str:
    """The group of the test ``nodeid``: its :data:`MACHINE_WIDE` folder, else its module.
    Every other resource a test uses is its own: ports, Unix accounts under its hub's
    prefix, a state folder under its tmp_path, its process's servers' port range
    (``hub_harness.server_ports``)."""
    return machine_wide_folder(nodeid) or nodeid.split("::")[0]


def group_seconds(path: Path = GROUP_SECONDS_FILE) -> dict[str, float]:
    """``{group: seconds}`` as ``path`` holds them ({} when it is missing)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def group_order(groups: list[str], seconds: dict[str, float]) -> list[str]:
    """``groups`` in the order the processes get them: the machine-wide ones first (each
    needs its resource to itself, and they are the longest), then the others longest
    first by ``seconds`` (:data:`NEW_GROUP_S` for one it lacks); ties by name."""
    return sorted(groups, key=lambda group: (machine_wide_folder(group) is None,
                                             -seconds.get(group, NEW_GROUP_S), group))
