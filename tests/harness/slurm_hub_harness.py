"""A real JupyterHub driving PDLSlurmSpawner on the simulated Slurm cluster.

The hub runs in the root namespace, which is the cluster's login node: it reaches
slurmctld at 10.78.0.10 and the compute nodes reach it at 10.78.0.1
(:mod:`slurm_harness`), where each user's controller listens (``PDL_CONTROLLER_IP``).
Users' homes are under the test's folder, which every node sees (one file system).
"""

from __future__ import annotations

from hub_harness import Hub, running


class SlurmHub(Hub):
    """The project's hub config in its Slurm mode (``PDL_SPAWNER=slurm``), on the simulated cluster."""

    def __init__(self, root, slurm, users: list[str], extra_config: str = "", hub_env: dict | None = None):
        config = f"""
# the simulated nodes declare fake GPUs that torch cannot see: the preflight's GPU check is off
c.Spawner.environment = {{"PDL_PREFLIGHT_SKIP": "gpu"}}
c.Spawner.start_timeout = 120
{extra_config}
"""
        super().__init__(root, users, pool=["cpu:0"], hub_env={
            "PDL_SPAWNER": "slurm",
            "PDL_CONTROLLER_IP": slurm.host_addr,
            "SLURM_CONF": str(slurm.conf_path),
            "PDL_DEFAULT_WORKERS": "1",
            **(hub_env or {}),
        }, extra_config=config)
        self.slurm = slurm

    def pdl_jobs(self, user: str | None = None) -> list[dict[str, str]]:
        """PDL's reservation jobs in Slurm's queue (of ``user``), as SlurmSim.jobs gives them."""
        return [j for j in self.slurm.jobs() if j["name"].startswith("pdl:")
                and (user is None or j["name"].split(":")[1] == user)]

    def check_nothing_left(self) -> None:
        """After :meth:`close`: what :meth:`Hub.check_nothing_left` checks, and no job of
        this hub's users left in Slurm's queue."""
        from waiting import wait_until

        super().check_nothing_left()
        wait_until(lambda: not [j for j in self.slurm.jobs() if j["user"].startswith(self.account_prefix)], 60,
                   what=f"the jobs of {self.account_prefix}* to leave Slurm's queue: {self.slurm.jobs()}")


def slurm_hub_fixture(root, slurm, users: list[str], extra_config: str = "", hub_env: dict | None = None):
    """For a ``hub`` fixture on the simulated Slurm cluster (``yield from``): a
    :class:`SlurmHub` :func:`~hub_harness.running` in ``root``; afterwards no job of its
    users is left."""
    with running(SlurmHub(root, slurm, users, extra_config=extra_config, hub_env=hub_env)) as hub:
        yield hub
