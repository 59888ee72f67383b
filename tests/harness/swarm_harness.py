"""A simulated 3-node Docker Swarm with one fake GPU per node, on this one machine.

:class:`SwarmSim` makes network namespaces ``pdl-node1..3`` (10.77.0.11-13) on a
bridge in a fourth namespace ``pdl-br``, plus a veth ``pdl-host`` that gives the root
namespace 10.77.0.1/24 on that bridge (tests and a hub in the root namespace reach the
nodes' services there). Nothing else is routed: the nodes reach only 10.77.0.0/24.

Each node runs its own ``dockerd`` (own data-root, exec-root, socket, pid file and
hostname ``pdl-node<i>``; ``--bridge=none``) that declares one GPU as the Swarm generic
resource ``NVIDIA-GPU=GPU-fake-<i>``. node1 is the manager; the swarm allocates overlay
subnets from 10.201.0.0/16, and each node its local ``docker_gwbridge`` (the way out of
overlay containers, and in to ports published in host mode) from 10.202.0.0/16. The
daemons manage iptables as on a real node, each in its own namespace's tables: NAT
out of the gateway bridge, published ports in, no traffic between containers on it. Images come from the host's Docker
engine (``load_images``): the nodes have no registry.

Everything lives under one run directory (``$PDL_SWARM_DIR``, default
``/var/tmp/pdl-swarm``): daemon configs, logs (``node<i>/dockerd.log``), sockets, pid
files. ``down()`` stops every process by recorded PID, then anything still running in
the namespaces or naming the run directory, and deletes the namespaces and veths. The
nodes' image stores are kept for the next run (``down(purge=True)`` deletes them), so
unchanged images are not loaded again. ``up()`` first cleans up what a crashed run
left. A lock file makes a second session wait instead of tearing down the first's.

Notes for tests: this kernel has no IPVS, so give services
``EndpointSpec(mode="dnsrr")`` (or use host networking); create them with
``init=True`` (stops take 10 s otherwise); the daemons never pull
(``DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1``); on an overlay network, start an anchor
service first (:meth:`SwarmSim.overlay_network`). Don't use docker-py's
``Service.scale()``/``update()`` (they restart every task): use
``client.api.update_service`` with the spec read back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdl.process import pid_alive
from sim_host import (Member, SimulatedCluster, bridged_namespaces, cmdline, netns_names, pids_naming, remove_links,
                      remove_namespaces, run, terminate, veth_names)
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RUN_DIR = "/var/tmp/pdl-swarm"
HOST_DOCKER = "/usr/bin/docker"  # Debian's docker.io client (scripts/docker-up)
TEST_IMAGES = ("pdl-notebook:test", "pdl-hub:test")
GPU_KIND = "NVIDIA-GPU"

# Runs inside the node's network namespace (`ip netns exec`: a private mount namespace
# with a fresh /sys, which has no cgroup mounts) and a new UTS namespace: set the node's
# hostname, mount the cgroups again (private to this mount namespace), exec dockerd.
_NODE_DOCKERD = r"""
set -e
hostname "$1"; shift
if grep -qE '^[^ ]+ /sys/fs/cgroup cgroup2 ' /proc/1/mounts; then
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
else
  mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup
  grep -E '^[^ ]+ /sys/fs/cgroup/[^ ]+ cgroup2? ' /proc/1/mounts | while read -r src dst type opts _; do
    mkdir -p "$dst"; mount -t "$type" -o "$opts" "$src" "$dst"
  done
fi
export DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1
exec "$@"
"""


class SwarmUnavailable(RuntimeError):
    """This machine cannot run the simulated swarm (not root, no Docker, ...)."""


def _dockerd_binary() -> str | None:
    for path in ("/usr/sbin/dockerd", "/usr/bin/dockerd"):
        if os.access(path, os.X_OK):
            return path
    return shutil.which("dockerd")


def unavailable_reason() -> str | None:
    """Why this machine cannot run :class:`SwarmSim` (None: it can, as far as we can tell)."""
    if not sys.platform.startswith("linux"):
        return f"the simulated swarm needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the simulated swarm needs root (network namespaces, dockerd)"
    for tool in ("ip", "unshare", "mount"):
        if not shutil.which(tool):
            return f"the simulated swarm needs the `{tool}` command"
    if run("unshare", "--net", "--mount", "true", check=False).returncode != 0:
        return "this process may not create network namespaces (a container without CAP_SYS_ADMIN?)"
    if not _dockerd_binary() or not os.access(HOST_DOCKER, os.X_OK):
        return f"no dockerd / {HOST_DOCKER} (scripts/docker-up installs Debian's docker.io)"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the Python package `docker` is not installed (scripts/setup --test)"
    return None


_DAEMON_COMMANDS = ("dockerd", "containerd", "runc", "docker")  # /proc/PID/comm prefixes


class SwarmSim(SimulatedCluster):
    """The simulated swarm. Nodes are numbered from 1; node 1 is the manager.
    ``down(purge=True)`` also deletes the nodes' image stores (the whole run directory)."""

    unavailable = SwarmUnavailable

    SUBNET = "10.77.0"
    ADDR_POOL = "10.201.0.0/16"

    def __init__(self, run_dir: str | os.PathLike | None = None, nodes: int = 3, prefix: str = "pdl-"):
        super().__init__(Path(run_dir or os.environ.get("PDL_SWARM_DIR") or DEFAULT_RUN_DIR).resolve())
        self.nodes = nodes
        self.prefix = prefix
        self.bridge_ns = f"{prefix}br"
        self.host_if = f"{prefix}host"
        self.host_addr = f"{self.SUBNET}.1"
        self._clients: dict[int, object] = {}
        self._procs: list[subprocess.Popen] = []  # our dockerds, reaped in down()

    # -- names and addresses -------------------------------------------------------

    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def netns(self, i: int) -> str:
        """The network namespace of node ``i`` (run a process there: ``ip netns exec NAME``)."""
        return f"{self.prefix}node{i}"

    def hostname(self, i: int) -> str:
        return f"{self.prefix}node{i}"

    def node_addr(self, i: int) -> str:
        return f"{self.SUBNET}.{10 + i}"

    def gpu(self, i: int) -> str:
        """The fake GPU id node ``i`` declares (``DOCKER_RESOURCE_NVIDIA-GPU`` in its tasks)."""
        return f"GPU-fake-{i}"

    def node_dir(self, i: int) -> Path:
        return self.run_dir / f"node{i}"

    def socket_path(self, i: int) -> Path:
        return self.node_dir(i) / "docker.sock"

    def docker_host(self, i: int) -> str:
        """``unix://...`` address of node ``i``'s daemon (for DOCKER_HOST or base_url)."""
        return f"unix://{self.socket_path(i)}"

    def log_path(self, i: int) -> Path:
        return self.node_dir(i) / "dockerd.log"

    # -- clients ---------------------------------------------------------------------

    def client(self, i: int):
        """A ``docker.DockerClient`` for node ``i``'s daemon."""
        if i not in self._clients:
            import docker

            self._clients[i] = docker.DockerClient(base_url=self.docker_host(i), timeout=120)
        return self._clients[i]

    def containers(self, i: int, all: bool = False, **filters) -> list:
        """Node ``i``'s containers matching Docker's ``filters`` (``all``: stopped ones too).

        A container removed between Docker's list and its inspection (a task Swarm is
        ending) is left out, never an error: the list is a snapshot of a moving cluster."""
        return self.client(i).containers.list(all=all, filters=filters, ignore_removed=True)

    @property
    def manager(self):
        """The client of node 1, the swarm manager."""
        return self.client(1)

    def hostnames_by_node_id(self) -> dict[str, str]:
        """Swarm node ID -> hostname (``pdl-node<i>``)."""
        return {n.id: n.attrs["Description"]["Hostname"] for n in self.manager.nodes.list()}

    def set_availability(self, node_id: str, availability: str, timeout: float = 30) -> None:
        """Set a node's availability ("active", "pause", "drain")."""
        self.update_node_spec(node_id, {"Availability": availability}, timeout)

    def set_labels(self, node_id: str, labels: dict[str, str], timeout: float = 30) -> None:
        """Set a node's labels (replacing those it had), as ``docker node update --label-add`` does."""
        self.update_node_spec(node_id, {"Labels": dict(labels)}, timeout)

    def update_node_spec(self, node_id: str, change: dict, timeout: float = 30) -> None:
        """Set fields of a node's spec (``Availability``, ``Labels``, ...).

        Swarm itself writes the node object too (its status, and a network
        attachment whenever a task on a new overlay lands there), and an update
        that names an older version is refused with "update out of sequence".
        So this is a compare-and-swap: read the current version, write it, and on
        that one refusal read again; any other error is raised.
        """
        from docker.errors import APIError

        def swapped():
            node = self.manager.nodes.get(node_id)
            spec = node.attrs["Spec"]
            if all(spec.get(k, {} if k == "Labels" else None) == v for k, v in change.items()):
                return True
            try:
                node.update({**spec, **change})
            except APIError as e:
                if "update out of sequence" in str(e.explanation):
                    return False
                raise
            return True

        wait_until(swapped, timeout, interval=0.1, what=f"node {node_id}'s spec set to {change}")

    # -- lifecycle -------------------------------------------------------------------

    # -- lifecycle: up() and down() (sim_host.SimulatedCluster) -----------------------------

    def unavailable_reason(self) -> str | None:
        return unavailable_reason()

    def _stages(self):
        return [("network", self._net_up), ("daemons", self._daemons_up), ("swarm", self._swarm_up)]

    def _stop(self) -> None:
        with contextlib.suppress(Exception):
            self._remove_workloads(timeout=15)
        self._cleanup_leftovers()

    # -- network -----------------------------------------------------------------------

    def _our_netns(self) -> list[str]:
        return [name for name in netns_names()
                if name == self.bridge_ns or (name.startswith(f"{self.prefix}node") and name[len(self.prefix) + 4:].isdigit())]

    def _our_links(self) -> list[str]:
        """Our veths in the root namespace: ``pdl-host``, and a node's pair that a crashed
        setup left there (exact names: other simulations share the ``pdl-`` prefix)."""
        def ours(name: str) -> bool:
            rest = name[len(self.prefix):]
            return name.startswith(self.prefix) and (rest in ("host", "hb") or (rest[:1] in ("n", "b") and rest[1:].isdigit()))

        return [name for name in veth_names() if ours(name)]

    def _net_up(self) -> None:
        members = [Member(self.netns(i), f"{self.node_addr(i)}/24", f"{self.prefix}n{i}", f"{self.prefix}b{i}")
                   for i in self.node_ids()]
        bridged_namespaces(self.bridge_ns, members, self.host_if, f"{self.prefix}hb", f"{self.host_addr}/24")

    # -- daemons -----------------------------------------------------------------------

    def _daemon_config(self, i: int) -> Path:
        d = self.node_dir(i)
        for sub in ("data", "exec"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        # a fresh swarm every run; the image store is kept
        shutil.rmtree(d / "data" / "swarm", ignore_errors=True)
        config = {
            "data-root": str(d / "data"),
            "exec-root": str(d / "exec"),
            "pidfile": str(d / "docker.pid"),
            "hosts": [self.docker_host(i)],
            "bridge": "none",
            "default-address-pools": [{"base": "10.202.0.0/16", "size": 24}],
            "cgroup-parent": f"/{self.prefix}swarm-node{i}",
            "node-generic-resources": [f"{GPU_KIND}={self.gpu(i)}"],
        }
        path = d / "daemon.json"
        path.write_text(json.dumps(config, indent=2) + "\n")
        return path

    def _daemons_up(self) -> None:
        dockerd = _dockerd_binary()
        procs = {}
        for i in self.node_ids():
            config = self._daemon_config(i)
            with open(self.log_path(i), "ab") as log:
                log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.hostname(i)}\n".encode())
                log.flush()
                # ip netns exec, unshare and sh all exec: the PID is dockerd's
                p = subprocess.Popen(
                    ["ip", "netns", "exec", self.netns(i), "unshare", "--uts", "sh", "-c", _NODE_DOCKERD,
                     "node-dockerd", self.hostname(i), dockerd, "--config-file", str(config)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            (self.node_dir(i) / "dockerd.launch.pid").write_text(f"{p.pid}\n")
            procs[i] = p
            self._procs.append(p)
        for i, p in procs.items():
            def answers(i=i, p=p):
                if p.poll() is not None:
                    raise RuntimeError(f"{self.hostname(i)}: dockerd exited ({p.returncode}):\n{self._tail(i, 15)}")
                try:
                    return self.client(i).ping()
                except Exception:
                    return False

            wait_until(answers, 60, what=f"{self.hostname(i)}'s dockerd")

    def _remove_workloads(self, timeout: float = 30) -> None:
        """Remove every service and container on every node, and the volumes PDL made."""
        with contextlib.suppress(Exception):
            for svc in self.manager.services.list():
                with contextlib.suppress(Exception):
                    svc.remove()
        deadline = time.monotonic() + timeout
        for i in self.node_ids():
            try:
                c = self.client(i)
                while self.containers(i, all=True) and time.monotonic() < deadline:
                    time.sleep(0.2)
                for ct in self.containers(i, all=True):
                    with contextlib.suppress(Exception):
                        ct.remove(force=True)
                for volume in c.volumes.list(filters={"label": "pdl.volume"}):  # users' homes and caches
                    with contextlib.suppress(Exception):
                        volume.remove(force=True)
            except Exception:
                continue

    def _recorded_pids(self) -> list[int]:
        pids = []
        for i in range(1, 64):
            d = self.node_dir(i)
            if not d.exists():
                if i > self.nodes:
                    break
                continue
            for name in ("dockerd.launch.pid", "docker.pid"):
                with contextlib.suppress(OSError, ValueError):
                    pids.append(int((d / name).read_text().strip()))
        # a recorded PID counts only while it is still our daemon (PIDs get reused)
        return [p for p in set(pids) if pid_alive(p) and str(self.run_dir) + "/" in cmdline(p)]

    def _cleanup_leftovers(self) -> None:
        """Stop our daemons (recorded PIDs first), anything else naming the run directory
        or living in our namespaces, then delete the namespaces, veths and cgroups."""
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        terminate(self._recorded_pids(), timeout=30)
        terminate(pids_naming(str(self.run_dir) + "/", _DAEMON_COMMANDS), timeout=10)
        for p in self._procs:  # reap them
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self._procs = [p for p in self._procs if p.returncode is None]
        remove_namespaces(self._our_netns())
        remove_links(self._our_links())
        cgroups = [*Path("/sys/fs/cgroup").glob(f"*/{self.prefix}swarm-node*"),
                   *Path("/sys/fs/cgroup").glob(f"{self.prefix}swarm-node*")]
        for cg in cgroups:
            with contextlib.suppress(OSError):
                for sub in sorted(cg.rglob("*"), key=lambda p: -len(p.parts)):
                    if sub.is_dir():
                        sub.rmdir()
                cg.rmdir()
        for i in range(1, 64):
            for name in ("dockerd.launch.pid", "docker.pid", "docker.sock"):
                with contextlib.suppress(OSError):
                    (self.node_dir(i) / name).unlink()

    def leftovers(self) -> dict[str, list]:
        """What of ours is still there (all empty after ``down()``)."""
        return {
            "processes": pids_naming(str(self.run_dir) + "/", _DAEMON_COMMANDS) + self._recorded_pids(),
            "netns": self._our_netns(),
            "veths": self._our_links(),
        }

    # -- swarm -------------------------------------------------------------------------

    def _swarm_up(self) -> None:
        m = self.manager
        # a crashed run may have left containers in the image stores we keep
        for i in self.node_ids():
            for ct in self.containers(i, all=True):
                with contextlib.suppress(Exception):
                    ct.remove(force=True)
        m.swarm.init(advertise_addr=self.node_addr(1), listen_addr=f"{self.node_addr(1)}:2377",
                     default_addr_pool=[self.ADDR_POOL], subnet_size=24)
        m.swarm.reload()
        token = m.swarm.attrs["JoinTokens"]["Worker"]
        for i in self.node_ids():
            if i == 1:
                continue
            self.client(i).swarm.join(remote_addrs=[f"{self.node_addr(1)}:2377"], join_token=token,
                                      listen_addr=f"{self.node_addr(i)}:2377", advertise_addr=self.node_addr(i))

        def all_ready():
            nodes = m.nodes.list()
            return len(nodes) == self.nodes and all(n.attrs["Status"]["State"] == "ready" for n in nodes)

        wait_until(all_ready, 60, what=f"{self.nodes} swarm nodes Ready")

    def reset(self, timeout: float = 30) -> None:
        """Remove every service, container and user-made network (between tests)."""
        self._remove_workloads(timeout=timeout)
        for i in self.node_ids():
            with contextlib.suppress(Exception):
                self.client(i).networks.prune()

    def overlay_network(self, name: str, anchor_image: str = TEST_IMAGES[0]):
        """An attachable overlay network plus a global "anchor" service on it.

        Without the anchor, GPU tasks on a fresh overlay churn ("node is missing
        network attachments", a Swarm bug). The anchor is ``<name>-anchor``.
        """
        from docker.types import EndpointSpec, ServiceMode

        m = self.manager
        nets = m.networks.list(names=[name])
        net = nets[0] if nets else m.networks.create(name, driver="overlay", attachable=True)
        anchor = f"{name}-anchor"
        if not m.services.list(filters={"name": anchor}):
            m.services.create(anchor_image, ["sleep", "infinity"], name=anchor, mode=ServiceMode("global"),
                              networks=[name], endpoint_spec=EndpointSpec(mode="dnsrr"), init=True)
        self.wait_tasks(anchor, self.nodes, timeout=60)
        return net

    def wait_tasks(self, service: str, n: int, timeout: float = 60, state: str = "running") -> list[dict]:
        """Wait until ``n`` tasks of ``service`` (name or id) are in ``state``; return them."""
        svc = self.manager.services.get(service)

        def enough():
            tasks = [t for t in svc.tasks() if t["Status"]["State"] == state]
            return tasks if len(tasks) >= n else None

        try:
            return wait_until(enough, timeout, interval=0.2, what=f"{n} {state} task(s) of {service}")
        except TimeoutError as e:
            states = [(t.get("Slot"), t["Status"]["State"], t["Status"].get("Err", "")) for t in svc.tasks()]
            raise TimeoutError(f"{e}; tasks: {states}") from None

    # -- images ------------------------------------------------------------------------

    def load_images(self, *tags: str) -> dict[str, list[int]]:
        """Copy images from the host's Docker engine into every node (docker save | load).

        A node that already has an image with the same ID is skipped, and a node gets
        only the layers it lacks (after a code change: the top layer), so a rebuilt
        image loads in seconds. Returns ``{tag: [nodes loaded]}``.
        """
        import threading

        t0 = time.monotonic()
        host = {}
        for tag in tags:
            p = run(HOST_DOCKER, "image", "inspect", "-f", "{{.Id}}", tag, check=False)
            if p.returncode != 0:
                raise RuntimeError(f"image {tag} is not in the host's Docker engine (scripts/build-images)")
            host[tag] = p.stdout.strip()
        loaded: dict[str, list[int]] = {tag: [] for tag in tags}
        have_layers: dict[int, set] = {}  # node -> every layer chain (diff-ID prefix) it holds
        for i in self.node_ids():
            images = self.client(i).api.images()
            ids = {t: img["Id"] for img in images for t in (img.get("RepoTags") or [])}
            for tag in tags:
                if ids.get(tag) != host[tag]:
                    loaded[tag].append(i)
            if any(i in nodes for nodes in loaded.values()):
                chains = set()
                for img in images:
                    diff_ids = self.client(i).api.inspect_image(img["Id"])["RootFS"].get("Layers", [])
                    chains.update(tuple(diff_ids[:k + 1]) for k in range(len(diff_ids)))
                have_layers[i] = chains
        if have_layers:
            needed = sorted(tag for tag, nodes in loaded.items() if nodes)
            with tempfile.TemporaryDirectory(dir=self.run_dir, prefix="images.") as tmp:
                saved = Path(tmp) / "saved"
                saved.mkdir()
                save = subprocess.Popen([HOST_DOCKER, "save", *needed], stdout=subprocess.PIPE)
                untar = run("tar", "-x", "-C", str(saved), stdin=save.stdout, check=False, text=False)
                save.stdout.close()
                if save.wait() != 0 or untar.returncode != 0:
                    raise RuntimeError(f"docker save {' '.join(needed)} failed: {untar.stderr!r}")
                self.timings["load_images.save"] = time.monotonic() - t0
                errors = []
                threads = [threading.Thread(target=self._load_into, args=(i, saved, chains,
                                            [t for t in needed if i in loaded[t]], errors))
                           for i, chains in have_layers.items()]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if errors:
                    raise RuntimeError("docker load failed: " + "; ".join(errors))
            for i in have_layers:  # the images these tags named before: disk, not needed
                with contextlib.suppress(Exception):
                    self.client(i).images.prune(filters={"dangling": True})
        self.timings["load_images"] = time.monotonic() - t0
        return loaded

    def _load_into(self, i: int, saved: Path, chains: set, tags: list[str], errors: list) -> None:
        """``docker load`` into node ``i`` the part of a ``docker save`` (extracted in
        ``saved``) that it lacks: layers it already holds are left out of the stream,
        which ``docker load`` accepts (it looks a layer up before reading its file)."""
        manifest = [m for m in json.loads((saved / "manifest.json").read_text())
                    if set(m.get("RepoTags") or []) & set(tags)]
        members: list[str] = []
        for m in manifest:
            members.append(m["Config"])
            diff_ids = json.loads((saved / m["Config"]).read_text())["rootfs"]["diff_ids"]
            for k, layer in enumerate(m["Layers"]):
                if tuple(diff_ids[:k + 1]) not in chains:
                    members.append(layer)
        own = saved.parent / self.hostname(i)
        own.mkdir()
        (own / "manifest.json").write_text(json.dumps(manifest))
        tar = subprocess.Popen(["tar", "-c", "--dereference", "-C", str(own), "manifest.json",
                                "-C", str(saved), *dict.fromkeys(members)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        load = subprocess.run([HOST_DOCKER, "-H", self.docker_host(i), "load", "-q"], stdin=tar.stdout,
                              capture_output=True, text=True)
        layers = sum(1 for m in members if m.endswith(".tar"))
        self.timings[f"load_images.{self.hostname(i)}"] = f"{time.monotonic() - t0:.1f} s, {layers} layers"
        tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace")
        if tar.wait() != 0 or load.returncode != 0:
            errors.append(f"{self.hostname(i)}: {tar_err.strip()} {load.stdout.strip()} {load.stderr.strip()}")

    # -- diagnostics -------------------------------------------------------------------

    def _tail(self, i: int, lines: int) -> str:
        try:
            return "\n".join(self.log_path(i).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def logs(self, tail: int = 40) -> str:
        """The last ``tail`` lines of each node daemon's log, with where the full logs are."""
        parts = [f"node daemon logs (full: {self.run_dir}/node*/dockerd.log)"]
        for i in self.node_ids():
            parts.append(f"---- {self.hostname(i)}: {self.log_path(i)}\n{self._tail(i, tail)}")
        return "\n".join(parts) + "\n"

    def failure_sections(self) -> list[tuple[str, str]]:
        """What a failing test's report shows of the swarm (tests/conftest.py), as (title, text)."""
        return [("swarm node daemons", self.logs(tail=40))]


# -- pytest support (used by tests/swarm/conftest.py) -----------------------------------------


def _prepare_host() -> str | None:
    """Start the host's Docker engine and build the test images (both cached; skipped
    with PDL_SKIP_IMAGE_BUILD=1, as scripts/test sets after doing it). Returns why the
    swarm cannot run here (None: it can); raises when the image build itself fails."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return unavailable_reason()
    if os.environ.get("PDL_SKIP_IMAGE_BUILD") != "1":
        up = run("bash", str(REPO / "scripts" / "docker-up"), check=False)
        if up.returncode != 0:
            return f"no Docker engine: scripts/docker-up failed: {(up.stderr or up.stdout).strip()[-500:]}"
        reason = unavailable_reason()
        if reason:
            return reason
        build = run("bash", str(REPO / "scripts" / "build-images"), check=False)
        if build.returncode != 0:
            raise RuntimeError(f"scripts/build-images failed:\n{(build.stdout + build.stderr)[-4000:]}")
    reason = unavailable_reason()
    if not reason and run(HOST_DOCKER, "info", check=False).returncode != 0:
        reason = "the host's Docker engine does not answer (scripts/docker-up starts it)"
    return reason


def swarm_session(images=TEST_IMAGES):
    """Generator behind the ``swarm`` fixture: images built, swarm up with them loaded."""
    import pytest

    t_prepare = time.monotonic()
    reason = _prepare_host()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"docker tests cannot run: {reason} (CI is set: failing instead of skipping)")
        pytest.skip(reason)
    t0 = time.monotonic()
    try:
        sim = SwarmSim().up()
    except SwarmUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"docker tests cannot run: {e} (CI is set: failing instead of skipping)")
        pytest.skip(str(e))
    sim.timings["prepare_host"] = t0 - t_prepare
    try:
        sim.load_images(*images)
        yield sim
    finally:
        sim.down()
