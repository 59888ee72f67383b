"""Stop the simulated swarm and Slurm cluster that a killed test run left running.

A session's clusters stop at its end, and the next ``up()`` stops what a crashed one
left; but scripts/test runs its timing tests before any cluster starts, and a cluster
left running would run beside them (a killed run's three node daemons and containers
made a balance test 15 % off). scripts/test runs this first, as root, when a network
namespace of theirs (``pdl-*``) is there: ``python tests/harness/leftover_clusters.py``.
"""

from __future__ import annotations

from slurm_harness import SlurmSim
from swarm_harness import SwarmSim


def stop_leftovers() -> None:
    """Stop both clusters (each waits for its run directory's lock: never a running session's)."""
    SwarmSim().down()
    SlurmSim().down()


if __name__ == "__main__":
    stop_leftovers()
