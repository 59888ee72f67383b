"""A real OpenID Connect provider on 127.0.0.1 for the login tests: npm's certified
``oidc-provider`` run by ``oidc_provider.mjs`` (next to this file), with a login form
whose fields are ``login`` and ``password``.

scripts/setup installs the package into ``.pdl/node``; :func:`install_problem` says
why it cannot run here, :func:`provider` starts one for a test and stops it after.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hub_harness import free_port
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("oidc_provider.mjs")
#: the node_modules that scripts/setup fills (``npm install --prefix .pdl/node``)
NODE_MODULES = REPO / ".pdl" / "node" / "node_modules"
#: the version scripts/setup pins
PACKAGE_VERSION = "9.13.3"
#: the oldest Node.js it runs on (it calls URL.parse and crypto.hash; Debian 12's own
#: nodejs, 18.x, lacks both); it warns, harmlessly, on anything older than 22
OLDEST_NODE = (20, 18)
READY_TIMEOUT_S = 30
STOP_TIMEOUT_S = 5


@dataclass(frozen=True)
class Provider:
    """A running provider. ``issuer`` is ``http://127.0.0.1:<port>`` (no trailing
    slash); its discovery document is ``issuer + "/.well-known/openid-configuration"``."""

    issuer: str
    port: int
    #: the provider's stdout and stderr, for a failing test's report
    log_dir: Path

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"


def install_problem() -> str | None:
    """Why the provider cannot run on this machine (one line), or None when it can."""
    if shutil.which("node") is None:
        return "node is not installed (scripts/setup installs nodejs)"
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    found = re.fullmatch(r"v(\d+)\.(\d+)\..*", version)
    if not found or (int(found[1]), int(found[2])) < OLDEST_NODE:
        return f"node {version} is too old for oidc-provider (it needs {'.'.join(map(str, OLDEST_NODE))} or later)"
    if not (NODE_MODULES / "oidc-provider" / "package.json").is_file():
        return f"npm's oidc-provider is not in {NODE_MODULES} (scripts/setup --test installs it)"
    return None



def _ready_issuer(stdout_log: Path) -> str | None:
    """The issuer from the ``ready <issuer>`` line, once the script has printed it."""
    for line in stdout_log.read_text(errors="replace").splitlines():
        if line.startswith("ready "):
            return line.removeprefix("ready ").strip()
    return None


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S` s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def provider(tmp_path: Path, accounts: dict, clients: list) -> Iterator[Provider]:
    """Start a provider for ``accounts`` and ``clients``, stopped on leaving.

    ``accounts``: ``{login: {"password": str, "claims": {"sub", "preferred_username",
    "email", "groups": [...]}}}`` (``sub`` defaults to the login name).
    ``clients``: ``[{"client_id", "client_secret", "redirect_uris": [...]}]``, confidential
    clients of the authorization code flow (PKCE optional; secret by HTTP Basic or POST).
    The config (it holds secrets) is written with mode 0600 under ``tmp_path``, next to
    the provider's logs. Raises RuntimeError, with the provider's stderr, when it ends
    before it is ready, and TimeoutError when it is not ready within
    :data:`READY_TIMEOUT_S` s.
    """
    problem = install_problem()
    if problem:
        raise RuntimeError(f"cannot start the OpenID Connect provider: {problem}")
    folder = tmp_path / "oidc-provider"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config_path = folder / "config.json"
    config = {"port": port, "clients": clients, "accounts": accounts, "cookie_keys": [os.urandom(32).hex()]}
    fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config, f)
    stdout_log, stderr_log = folder / "stdout.log", folder / "stderr.log"
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
    with open(stdout_log, "wb") as out, open(stderr_log, "wb") as err:
        process = subprocess.Popen(["node", str(SCRIPT), str(config_path)], cwd=folder, env=env,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    try:
        issuer = wait_until(lambda: process.poll() is not None or _ready_issuer(stdout_log),
                            timeout=READY_TIMEOUT_S, what="the OpenID Connect provider's ready line")
        if process.poll() is not None:
            raise RuntimeError(f"the OpenID Connect provider ended ({process.returncode}) before it was ready:\n"
                               + stderr_log.read_text(errors="replace"))
        yield Provider(issuer=issuer, port=port, log_dir=folder)
    finally:
        _stop(process)
