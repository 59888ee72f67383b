"""The hub *image* on the simulated swarm, started by the README's own command.

:func:`readme_commands` reads "Replicate on another cluster" from README.md: the
``docker run`` command and the upgrade's ``docker stop``/``docker rm`` line. The tests
change only the registry, the addresses, the public URL (:data:`PUBLIC_NAME`), the
certificate's folder (the test CA's, for the public name and its wildcard) and the
Docker socket's host path (:func:`for_the_sim`), and add ``-e PDL_PREFLIGHT_SKIP=gpu``
(the simulated nodes declare GPUs torch cannot see); each change must find its text in
the README exactly once, so the README and the tests cannot drift apart. :class:`ImageHub` runs the command with
the host's Docker client against the manager's engine (node1): the hub's container
then lives in node1's network namespace, with node1's host name, which resolves nowhere.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import requests

import host_names
from hub_harness import REPO
from pdl_spawner.accounts.credentials import USED
from swarm_harness import HOST_DOCKER
from swarm_hub_harness import SwarmHub
from waiting import wait_until

README = REPO / "README.md"
CONTAINER = "pdl-hub"
STATE_VOLUME = "pdl-hub-state"
#: The README's placeholders, and the versions its example names.
README_HUB_IMAGE = "REGISTRY/pdl-hub:0.1.0"
README_NOTEBOOK_IMAGE = "REGISTRY/pdl-notebook:0.1.0"
README_PUBLIC_URL = "https://hub.lab.example"
README_TLS_FOLDER = "/etc/pdl/tls"
#: The files the README's command names in its certificate folder.
TLS_FILES = ("hub.crt", "hub.key")
#: The hub's public name in the tests: it and its subdomains lead to node1, as a lab's
#: wildcard DNS entry would (host_names: the tests' clients and Chromium).
PUBLIC_NAME = "pdl-hub.test"


def public_url() -> str:
    return f"https://{PUBLIC_NAME}"


def readme_commands() -> tuple[str, str]:
    """(the ``docker run`` command, the upgrade's ``docker stop ... && docker rm ...``
    line) of README.md's "Replicate on another cluster", continuation lines joined."""
    section = README.read_text().split("\n## Replicate on another cluster\n", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    (run,) = [line for line in lines if line.startswith("docker run ")]
    (stop,) = [line for line in lines if line.startswith("docker stop ")]
    return run, stop


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the README's command no longer has {old!r} once: {text}"
    return text.replace(old, new)


def for_the_sim(command: str, swarm, hub_image: str, notebook_image: str, tls_folder: Path) -> str:
    """The README's ``docker run`` with the sim's registry (none: local tags), addresses,
    certificate folder (``tls_folder``, holding :data:`TLS_FILES`) and manager socket."""
    nodes = ",".join(swarm.hostname(i) for i in swarm.node_ids())
    command = replace_once(command, README_HUB_IMAGE, hub_image)
    command = replace_once(command, README_NOTEBOOK_IMAGE, notebook_image)
    command = replace_once(command, "PDL_HUB_CONNECT_IP=10.0.0.5", f"PDL_HUB_CONNECT_IP={swarm.node_addr(1)}")
    command = replace_once(command, "PDL_NODES=gpu1,gpu2,gpu3", f"PDL_NODES={nodes}")
    command = replace_once(command, f"PDL_PUBLIC_URL={README_PUBLIC_URL}", f"PDL_PUBLIC_URL={public_url()}")
    command = replace_once(command, "-v /var/run/docker.sock:", f"-v {swarm.socket_path(1)}:")
    command = replace_once(command, f"-v {README_TLS_FOLDER}:", f"-v {tls_folder}:")
    # the fake GPUs are invisible to torch: the preflight's GPU check would stop every cell
    return replace_once(command, f" {hub_image}", f" -e PDL_PREFLIGHT_SKIP=gpu {hub_image}")


class ImageHub(SwarmHub):
    """The hub image run by the README's command on node1 of ``swarm``, users as the
    README lists them (the first, ``alice``, is the admin), with ``tls`` (a
    :class:`~lab_tls.Issued` for :data:`PUBLIC_NAME` and its wildcard) as its certificate.
    The REST calls of :class:`~hub_harness.Hub` use the admin's own API token, made after
    her login; they and the tests' own must trust the CA (``REQUESTS_CA_BUNDLE``)."""

    def __init__(self, root: Path, swarm, hub_image: str, tls, notebook_image: str = "pdl-notebook:test"):
        # Hub's attributes the REST helpers use; nothing of a local hub process is started
        self.root, self.swarm = Path(root), swarm
        self.notebook_image = notebook_image
        self.run_command, self.stop_command = readme_commands()
        self.users = next(arg.split("=", 1)[1] for arg in shlex.split(self.run_command)
                          if arg.startswith("PDL_USERS=")).split(",")
        host_names.register(PUBLIC_NAME, swarm.node_addr(1))
        self.url = public_url()
        self.token = ""
        self.passwords: dict[str, str] = {}
        self.image = hub_image
        self.proc = None
        self.kept_logs: dict[str, str] = {}  # as SwarmHub's: servers' logs kept when a failing test stops them
        self.tls_folder = self.root / "tls"  # what the README mounts from /etc/pdl/tls
        self.tls_folder.mkdir(mode=0o700, exist_ok=True)
        for name, source in zip(TLS_FILES, (tls.cert, tls.key)):
            shutil.copyfile(source, self.tls_folder / name)
        (self.tls_folder / TLS_FILES[1]).chmod(0o600)

    # -- Docker on the manager ---------------------------------------------------------

    def shell(self, command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """``command`` in a shell whose ``docker`` is the host's client, talking to node1's engine."""
        env = {"PATH": f"{Path(HOST_DOCKER).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
               "DOCKER_HOST": self.swarm.docker_host(1)}
        r = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{command!r} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def container_running(self) -> bool:
        r = self.shell(f"docker inspect -f '{{{{.State.Running}}}}' {CONTAINER}", check=False)
        return r.stdout.strip() == "true"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, image: str | None = None) -> ImageHub:
        """Run the README's command with ``image`` (default: the one given at first), wait
        until the hub answers, then log the admin in for an API token and sign the other
        listed users up (once: the state volume keeps them)."""
        self.image = image or self.image
        if not self.token:  # the first start: no container or state of a killed run's (its users signed up)
            self.shell(f"docker rm -f {CONTAINER}; docker volume rm -f {STATE_VOLUME}", check=False)
        self.shell(for_the_sim(self.run_command, self.swarm, self.image, self.notebook_image, self.tls_folder))
        wait_until(self._up, 120, what=lambda: f"the hub image to answer at {self.url}:\n{self.log_tail()}")
        if not self.token:
            self.token = self.own_token(self.users[0])
        self.sign_up_listed_users()
        return self

    def _up(self) -> bool:
        if not self.container_running():
            raise RuntimeError(f"the hub's container stopped:\n{self.log_tail()}")
        try:
            return requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not answering yet: still starting
            return False

    def stop_hub(self, sig=None) -> None:
        """The README's upgrade line: stop and remove the hub's container (the volume stays)."""
        self.shell(self.stop_command, timeout=60)

    def close(self) -> None:
        """Stop every user's server through the hub, then remove its container and volume."""
        try:
            if self.container_running():
                for user in self.users:
                    self.api("DELETE", f"/users/{user}/server", timeout=30)
                wait_until(lambda: not self.running_servers(), 120, what="servers to stop")
        finally:
            self.shell(f"docker rm -f {CONTAINER}; docker volume rm -f {STATE_VOLUME}", check=False)
            host_names.unregister(PUBLIC_NAME)

    # -- users ---------------------------------------------------------------------------

    def signup_codes(self) -> dict[str, str]:
        """The listed users' unused sign-up codes, as the README says to read them (the state volume)."""
        text = self.shell(f"docker exec {CONTAINER} cat /srv/jupyterhub/state/signup-codes").stdout
        return {name: code for name, code in (line.split() for line in text.splitlines() if len(line.split()) == 2)
                if code != USED}

    def password(self, user: str) -> str:
        """The admin's as the README says to read it (the state volume), others' as they signed up."""
        if user == self.users[0]:
            return self.shell(f"docker exec {CONTAINER} cat /srv/jupyterhub/state/password").stdout.strip()
        return self.passwords[user]

    def own_token(self, user: str) -> str:
        """An API token ``user`` makes for themselves after logging in (as on the hub's token page)."""
        s = self.login(user)
        r = s.post(f"{self.url}/hub/api/users/{user}/tokens", json={"note": "tests"}, timeout=30,
                   headers={"X-XSRFToken": s.cookies.get("_xsrf", ""), "Referer": f"{self.url}/hub/token"})
        r.raise_for_status()
        return r.json()["token"]

    # -- what a failing test shows -----------------------------------------------------------

    def log_tail(self, n: int = 80) -> str:
        r = self.shell(f"docker logs --tail {n} {CONTAINER}", check=False)
        return (r.stdout + r.stderr).strip()

    def failure_sections(self) -> list[tuple[str, str]]:
        sections = [("hub container log", self.log_tail(200))]
        sections += [(f"service log ({name})", text) for name, text in self.server_logs().items()]
        return sections
