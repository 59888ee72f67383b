"""The user's laptop: a network namespace of its own, joined to the root namespace (where
the hub runs) by one veth, and nothing else. Its ``/etc/hosts`` (``/etc/netns/<name>/hosts``,
which ``ip netns exec`` puts in place of the machine's) is its only way to the hub's
names; its Chromium trusts the lab's CA through the NSS database of its own home.

By default the veth's other end is in the root namespace, ``hub_addr`` there (the address
the hub listens on), ``addr`` the laptop's; each pytest worker has a subnet of its own,
10.80.<worker>.0/24 (the simulated Swarm has 10.77, Slurm 10.78, the linked engines 10.79).
A laptop on a simulated cluster's network instead (:class:`OnBridge`: the Swarm's, where
the manager is the hub) has its veth's other end on that cluster's bridge.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sim_host import remove_links, remove_namespaces, run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def worker_index() -> int:
    """This pytest worker's number (gw3: 3; 0 without xdist): its laptop's subnet or address."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


@dataclass(frozen=True)
class OnBridge:
    """Where a laptop joins a simulated cluster's network: the namespace of its bridge
    (``br0``), the laptop's address there (without the prefix length, a /24) and the
    hub's (the manager node's)."""

    bridge_ns: str
    addr: str
    hub_addr: str


class Laptop:
    """A laptop namespace (:meth:`up`, :meth:`down`), whose hosts file sends ``names`` to
    the hub's address and whose browser trusts ``ca_pem``; ``on_bridge``: joined to a
    cluster's bridge instead of the root namespace."""

    def __init__(self, folder: Path, names: list[str], ca_pem: Path, on_bridge: OnBridge | None = None):
        k = worker_index()
        self.netns = f"pdl-laptop{k}"
        self.outer = f"pdl-lt{k}"  # the veth's other end: in the root namespace, or on the bridge
        self.hub_addr, self.addr = f"10.80.{k}.1", f"10.80.{k}.2"
        self.on_bridge = on_bridge
        if on_bridge:
            self.hub_addr, self.addr = on_bridge.hub_addr, on_bridge.addr
        self.folder = Path(folder)
        self.home = self.folder / "home"  # $HOME of its browser: the NSS database
        self.names = names
        self.ca_pem = Path(ca_pem)

    # -- lifecycle -------------------------------------------------------------------

    def up(self) -> Laptop:
        self.down()  # what a killed run left
        run("ip", "netns", "add", self.netns)
        run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        if self.on_bridge:
            ns = self.on_bridge.bridge_ns
            run("ip", "link", "set", self.outer, "netns", ns)
            run("ip", "-n", ns, "link", "set", self.outer, "master", "br0")
            run("ip", "-n", ns, "link", "set", self.outer, "up")
        else:
            run("ip", "addr", "add", f"{self.hub_addr}/24", "dev", self.outer)
            run("ip", "link", "set", self.outer, "up")
        run("ip", "-n", self.netns, "link", "set", "lo", "up")
        run("ip", "-n", self.netns, "addr", "add", f"{self.addr}/24", "dev", "eth0")
        run("ip", "-n", self.netns, "link", "set", "eth0", "up")
        etc = Path("/etc/netns") / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{self.hub_addr} {n}\n" for n in self.names))
        self._trust_ca()
        return self

    def down(self) -> None:
        remove_namespaces([self.netns])  # and with it its veth, both ends
        remove_links([self.outer])
        shutil.rmtree(Path("/etc/netns") / self.netns, ignore_errors=True)

    def _trust_ca(self) -> None:
        db = self.home / ".pki" / "nssdb"
        db.mkdir(parents=True, exist_ok=True)
        run("certutil", "-d", f"sql:{db}", "-N", "--empty-password")
        run("certutil", "-d", f"sql:{db}", "-A", "-t", "C,,", "-n", "PDL test lab CA", "-i", str(self.ca_pem))

    # -- inside it -------------------------------------------------------------------

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``cmd`` in the laptop's namespace (its hosts file in place)."""
        return subprocess.run(["ip", "netns", "exec", self.netns, *cmd], capture_output=True, text=True,
                              timeout=timeout)

    def can_connect(self, port: int, host: str | None = None) -> bool:
        """Whether a TCP connection from the laptop to ``host`` (the hub's address) at ``port`` opens."""
        code = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), 5).close()\n"
                "except OSError:\n    sys.exit(1)\n")
        return self.run("python3", "-c", code, host or self.hub_addr, str(port)).returncode == 0

    def browser_command(self) -> Path:
        """An executable that starts Chromium in the laptop's namespace with its home."""
        wrapper = self.folder / "chromium-on-the-laptop"
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {self.netns} env HOME={self.home} {CHROMIUM} "$@"\n')
        wrapper.chmod(0o755)
        return wrapper


@contextlib.contextmanager
def laptop(folder: Path, names: list[str], ca_pem: Path, on_bridge: OnBridge | None = None):
    """A :class:`Laptop` up for the block, down after it."""
    machine = Laptop(folder, names, ca_pem, on_bridge).up()
    try:
        yield machine
    finally:
        machine.down()
