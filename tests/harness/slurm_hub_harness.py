"""A real JupyterHub driving PDLSlurmSpawner on the simulated Slurm cluster.

The hub runs in the root namespace, which is the cluster's login node: it reaches
slurmctld at 10.78.0.10 and the compute nodes reach it at 10.78.0.1
(:mod:`slurm_harness`), where each user's controller listens (``PDL_CONTROLLER_IP``).
Users' homes are under the test's folder, which every node sees (one file system).
"""

from __future__ import annotations

import slurm_harness
from fault_cells import SUM, magic
from hub_harness import Hub, Kernel, openmp_wait_env, pids_matching, process_env, running, runs_as_root
from waiting import wait_until


def slurm_engines(root) -> dict[int, dict[str, str]]:
    """Engine processes (job steps, on any node) of users whose homes are under ``root``
    -> their PDL_* variables, SLURM_JOB_ID, SLURMD_NODENAME and CUDA_VISIBLE_DEVICES."""
    found = {}
    def engine(cmd: str, cwd: str) -> bool:  # the engine, not the srun that started its step
        return "-m pdl_spawner.slurm.engine_boot" in cmd and not cmd.startswith("srun ") and cwd.startswith(str(root))

    for pid in pids_matching(engine):
        env = process_env(pid)
        if env is not None:
            found[pid] = {k: v for k, v in env.items() if k.startswith("PDL_") or k in (
                "SLURM_JOB_ID", "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES", "HOME")}
    return found


class SlurmHub(Hub):
    """The project's hub config in its Slurm mode (``PDL_SPAWNER=slurm``), on the simulated cluster."""

    def __init__(self, root, slurm, users: list[str], extra_config: str = "", hub_env: dict | None = None,
                 spawner_env: dict | None = None, public_url: str | None = None):
        """``spawner_env``: more of the servers' (and so the engines') environment;
        ``public_url``: a lab's name (:class:`~hub_harness.Hub`)."""
        env = {"PDL_PREFLIGHT_SKIP": "gpu", **openmp_wait_env(), **(spawner_env or {})}
        config = f"""
# the simulated nodes declare fake GPUs that torch cannot see: the preflight's GPU check is off
c.Spawner.environment = {env!r}
c.Spawner.start_timeout = 120
{extra_config}
"""
        super().__init__(root, users, pool=["cpu:0"], hub_env={
            "PDL_SPAWNER": "slurm",
            "PDL_CONTROLLER_IP": slurm.host_addr,
            "SLURM_CONF": str(slurm.conf_path),
            "PDL_DEFAULT_WORKERS": "1",
            # the cluster enforces associations: the hub adds each account to the lab's
            "PDL_SLURM_ACCOUNT": slurm_harness.LAB_ACCOUNT,
            **(hub_env or {}),
        }, extra_config=config, public_url=public_url)
        # the admin view tells PDL's jobs by the accounts' prefix: jupyterhub_config.py
        # gives it the one from the environment
        self.hub_env["PDL_ACCOUNT_PREFIX"] = self.account_prefix
        self.slurm = slurm

    def pdl_jobs(self, user: str | None = None) -> list[dict[str, str]]:
        """PDL's reservation jobs in Slurm's queue (of ``user``), as SlurmSim.jobs gives them."""
        return [j for j in self.slurm.jobs() if j["name"].startswith("pdl:")
                and (user is None or j["name"].split(":")[1] == user)]

    def wait_no_pdl_jobs(self, timeout: float = 60) -> None:
        """Wait (up to ``timeout`` s) until no PDL job is left in Slurm's queue (a test's
        last step: the servers it stopped have cancelled theirs, completing ones included)."""
        wait_until(lambda: not self.pdl_jobs(), timeout, what=lambda: f"every PDL job to go: {self.slurm.jobs()}")

    def delete_account(self, user: str) -> None:
        """Remove ``user``'s account from Slurm's accounting (the hub added it to the lab's
        account), then delete the Unix account as :meth:`Hub.delete_account` does.
        slurmctld keeps each association with its uid: a uid that a later test's new
        account gets would otherwise still have this one's association (the unknown
        user of ``test_slurm_limits.py`` got a job so)."""
        if runs_as_root():
            name = self.account(user)
            # Slurm keeps the account of a user with jobs in its queue
            wait_until(lambda: not [j for j in self.slurm.jobs() if j["user"] == name], 60,
                       what=lambda: f"{name}'s jobs to leave Slurm's queue: {self.slurm.jobs()}")
            self.slurm.run("sacctmgr", "--immediate", "delete", "user", f"name={name}")
        super().delete_account(user)

    def check_nothing_left(self) -> None:
        """After :meth:`close`: what :meth:`Hub.check_nothing_left` checks, and no job of
        this hub's users left in Slurm's queue, and no engine on any node."""
        super().check_nothing_left()
        wait_until(lambda: not slurm_engines(self.root), 30, what="every engine step to end")
        wait_until(lambda: not [j for j in self.slurm.jobs() if j["user"].startswith(self.account_prefix)], 60,
                   what=f"the jobs of {self.account_prefix}* to leave Slurm's queue: {self.slurm.jobs()}")


def spawn_and_sum(hub: SlurmHub, user: str, gpus: int) -> tuple[dict[str, str], Kernel]:
    """Spawn ``user``'s server with ``gpus`` GPUs, open a kernel and run one all-reduce
    over them: ``(their job as SlurmSim.jobs gives it, the kernel)``; close the kernel."""
    hub.spawn(user, gpus)
    hub.wait_ready(user, timeout=120)
    [job] = hub.pdl_jobs(user)
    kernel = Kernel(hub, user)
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        assert f"sum {gpus}" in kernel.execute_ok(magic(SUM, gpus), timeout=120)["stdout"]
    except BaseException:
        kernel.close()
        raise
    return job, kernel


def slurm_hub_fixture(root, slurm, users: list[str], extra_config: str = "", hub_env: dict | None = None,
                      spawner_env: dict | None = None, public_url: str | None = None):
    """For a ``hub`` fixture on the simulated Slurm cluster (``yield from``): a
    :class:`SlurmHub` :func:`~hub_harness.running` in ``root``; afterwards no job of its
    users is left."""
    with running(SlurmHub(root, slurm, users, extra_config=extra_config, hub_env=hub_env,
                          spawner_env=spawner_env, public_url=public_url)) as hub:
        yield hub
