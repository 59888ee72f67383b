"""A real JupyterHub driving PDLSwarmSpawner on the simulated swarm, and ways to look
at what it made there (services, secrets, how a task's process runs)."""

from __future__ import annotations

import json
import re
import sys

import requests
from docker.errors import DockerException

from hub_harness import Hub, admin_status, openmp_wait_env, running  # noqa: F401 - admin_status: the swarm tests' too
from waiting import wait_until

IMAGE = "pdl-notebook:test"

#: A small DDP training across the 3 nodes (one rank per node): each rank prints its
#: host, GPU, loss and the (identical, if DDP works) sum of its weights.
DDP_CELL = """%%distributed -n 3 --all-output
import os, torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(rank)                      # each rank its own data
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
w_true = torch.arange(8.0)[:, None]
for step in range(300):
    x = torch.randn(32, 8)
    loss = ((model(x) - x @ w_true) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
w = model.module.weight.detach().flatten()
print(f"rank {rank}/{world_size} host {os.environ['PDL_ENGINE_HOST']} gpu {os.environ['PDL_GPU']} "
      f"loss {loss.item():.4f} weights {w.sum().item():.4f}")
"""
DDP_RESULT = re.compile(r"rank (\d)/3 host (\S+) gpu (\S+) loss ([\d.]+) weights (-?[\d.]+)")
#: The same three engines switched to Horovod: one rank per node, gloo between the
#: nodes; each rank prints its ranks, host and the allreduced sum (6 when it works).
HVD_CELL = """%%distributed -n 3 --backend horovod --all-output
import os, torch
total = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum)
print(f"hvd {hvd.rank()}/{hvd.size()} local {hvd.local_rank()}/{hvd.local_size()} "
      f"cross {hvd.cross_rank()}/{hvd.cross_size()} host {os.environ['PDL_ENGINE_HOST']} sum {int(total.item())}")
"""
HVD_RESULT = re.compile(r"hvd (\d)/3 local 0/1 cross (\d)/3 host (\S+) sum 6")


#: Run in a notebook container: the last {tail} lines of each ipyparallel log of its
#: cluster folder, but the idle watch's queue requests.
CONTROLLER_LOG = """for f in "${{PDL_CLUSTER_DIR:-$HOME/.pdl/cluster}}"/profile/log/*.log; do
echo "== $f"; grep -v "requested 'queue_request'" "$f" | tail -n {tail}; done"""


class SwarmHub(Hub):
    """The project's hub config in its swarm mode (``PDL_SPAWNER=swarm``), on the simulated swarm."""

    def __init__(self, root, swarm, users: list[str], extra_config: str = "", hub_env: dict | None = None):
        """``extra_config``: lines appended to the hub's config, e.g. PDLSwarmSpawner settings;
        ``hub_env``: more of the hub's environment (e.g. ``PDL_ENGINE_IDLE_TIMEOUT``)."""
        env = {"PDL_PREFLIGHT_SKIP": "gpu", **openmp_wait_env()}
        # appended to the config by Hub._write_config, the caller's lines last
        config = f"""
c.JupyterHub.hub_ip = {swarm.host_addr!r}   # the hub API listens on the sim's bridge only
# the simulated nodes declare fake GPUs that torch cannot see: the preflight's GPU check is off
c.Spawner.environment = {env!r}
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120
{extra_config}
"""
        super().__init__(root, users, pool=["cpu:0"], hub_env={
            "PDL_SPAWNER": "swarm",
            "PDL_HUB_IP": "127.0.0.1",                # the proxy, for the tests' browser and API calls
            "PDL_HUB_CONNECT_IP": swarm.host_addr,    # containers on the nodes reach the hub API here
            "DOCKER_HOST": swarm.docker_host(1),      # the manager's engine
            "PDL_NOTEBOOK_IMAGE": IMAGE,
            "PDL_DEFAULT_WORKERS": "1",
            **(hub_env or {}),
        }, extra_config=config)
        self.swarm = swarm
        #: What a failing test's servers said before its clean-up stopped them (:meth:`api`).
        self.kept_logs: dict[str, str] = {}

    def api(self, method: str, path: str, token: str | None = None, **kwargs) -> requests.Response:
        """As :meth:`Hub.api`; a server stopped while an exception unwinds (a failing
        test's ``finally``) first has its services' logs and its controller's kept for
        the report (:meth:`failure_sections`), since they go with its services."""
        stopped = re.fullmatch(r"/users/([^/]+)/server", path) if method == "DELETE" else None
        if stopped and sys.exc_info()[1] is not None:
            self.kept_logs.update(self.server_logs(user=stopped[1], tail=200))
            self.kept_logs.update(self.controller_log(stopped[1]))
        return super().api(method, path, token=token, **kwargs)

    def server_logs(self, tail: int = 40, user: str | None = None) -> dict[str, str]:
        """The last ``tail`` lines of the logs of every service PDL made (a server's notebook
        and its engines; of ``user`` only if given), by service."""
        logs = {}
        try:
            services = self.swarm.manager.services.list(filters={"label": f"pdl.user={user}" if user else "pdl.owner"})
        except (DockerException, requests.RequestException) as e:  # a report shows what it can
            return {"(services)": f"could not list PDL's services: {e}"}
        for service in services:
            try:
                lines = b"".join(service.logs(stdout=True, stderr=True, tail=tail, timestamps=False))
                logs[service.name] = lines.decode(errors="replace").rstrip()
            except (DockerException, requests.RequestException) as e:
                logs[service.name] = f"(no log: {e})"
        return logs

    def controller_log(self, user: str, tail: int = 200) -> dict[str, str]:
        """The last ``tail`` lines of the ipyparallel logs in ``user``'s notebook container
        (its controller's) but the idle watch's look every 2 s, as {title: text}; empty
        when no node runs it."""
        for i in self.swarm.node_ids():
            try:
                for container in self.swarm.containers(i, label=f"com.docker.swarm.service.name=pdl-{user}"):
                    out = container.exec_run(["sh", "-c", CONTROLLER_LOG.format(tail=tail)])
                    return {f"pdl-{user}: ipyparallel logs": out.output.decode(errors="replace").rstrip()}
            except (DockerException, requests.RequestException) as e:
                return {f"pdl-{user}: ipyparallel logs": f"(none: {e})"}
        return {}

    def failure_sections(self) -> list[tuple[str, str]]:
        """:meth:`Hub.failure_sections`, then the logs kept at a failing test's clean-up
        (once: the next test's report starts without them)."""
        kept, self.kept_logs = self.kept_logs, {}
        return super().failure_sections() + [(f"kept at its stop: {name}", text) for name, text in kept.items()]

    def check_nothing_left(self) -> None:
        """After :meth:`close`: fail unless every service and secret PDL made is gone, and
        remove what is left of its services either way."""
        try:
            wait_until(lambda: pdl_objects(self.swarm) == ([], []), 60, what="PDL's services and secrets to go")
        finally:
            for svc in self.swarm.manager.services.list(filters={"label": "pdl.owner"}):
                svc.remove()


# Run in a task's container: how the PDL process (pdl-singleuser / pdl-engine) runs.
INSPECT = """
import json, os, stat, sys
pid = min(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
          and any(a.endswith(sys.argv[1].encode())
                  for a in open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")[:2]))
status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
secret = os.stat(sys.argv[2])
print(json.dumps({
    "uid": status["Uid"].split()[0], "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "secret_mode": oct(stat.S_IMODE(secret.st_mode)), "secret_uid": secret.st_uid,
    "docker_socket": any(os.path.exists(p) for p in ("/var/run/docker.sock", "/run/docker.sock")),
    "environ": open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"),
}))
"""


def inspect_task(swarm, service: str, program: str, secret: str) -> dict:
    """How ``program`` runs in the container of ``service`` (on whichever node has it)."""
    for i in swarm.node_ids():
        found = swarm.containers(i, label=f"com.docker.swarm.service.name={service}")
        if found:
            out = found[0].exec_run(["python", "-c", INSPECT, program, secret])
            assert out.exit_code == 0, out.output.decode()
            return json.loads(out.output.decode().strip().splitlines()[-1])
    raise AssertionError(f"no container of {service} on any node")


def pdl_objects(swarm, user=None):
    """Services and secrets PDL made (of ``user``), by name."""
    label = f"pdl.user={user}" if user else "pdl.owner"
    m = swarm.manager
    return (sorted(s.name for s in m.services.list(filters={"label": label})),
            sorted(s.name for s in m.secrets.list(filters={"label": label})))


def swarm_hub_fixture(root, swarm, users: list[str], extra_config: str = "", hub_env: dict | None = None):
    """For a ``hub`` fixture on the simulated swarm (``yield from``): a :class:`SwarmHub`
    :func:`~hub_harness.running` in ``root``; afterwards the hub is closed and every service
    and secret PDL made is gone."""
    with running(SwarmHub(root, swarm, users, extra_config=extra_config, hub_env=hub_env)) as hub:
        yield hub


