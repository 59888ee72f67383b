"""What the user's server, the hub and the admin view load when they start.

Every spawn starts a Jupyter server (and every hub start a hub): what they import is
paid in CPU seconds by each of them, on the machine every user shares.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hub_harness import free_port
from waiting import wait_until

pytestmark = pytest.mark.unit

#: The processes PDL starts per hub and per spawn, by the modules they run.
STARTED_PROCESSES = ("jupyterhub.app", "jupyterhub.singleuser", "pdl_server.singleuser", "pdl_server.jupyter_process",
                     "pdl_spawner.admin.view", "jupyterlab")


def test_no_process_of_a_spawn_compiles_iri_grammars_at_start():
    """jsonschema 4.25+ imports rfc3987-syntax for its format checkers, which builds 35
    Earley grammars at import: 2 CPU-s in each Jupyter process (pyproject.toml pins
    jsonschema below it). None of PDL's processes may load it."""
    probe = (f"import importlib, sys\n"
             f"for name in {STARTED_PROCESSES!r}: importlib.import_module(name)\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('rfc3987_syntax', 'lark')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, check=True).stdout.strip()
    assert loaded == "[]", f"a spawn's processes load the IRI grammars: {loaded}"


@contextlib.contextmanager
def lab_server(tmp_path: Path, path_first: Path | None = None):
    """A JupyterLab server started as pdl-singleuser starts a user's server (through
    pdl_server.jupyter_process, PDL's Jupyter config from this prefix), on a free 127.0.0.1 port with the token ``t0ken``, ``path_first`` (a
    folder) first on its PATH; yields (its base URL, its log file) once it answers."""
    port = free_port()
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY"))}
    env.update(HOME=str(tmp_path), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "pdl_server.jupyter_process", "jupyterlab",
                                   "--no-browser", f"--port={port}",
                                   "--ip=127.0.0.1", "--IdentityProvider.token=t0ken", "--allow-root",
                                   f"--ServerApp.root_dir={tmp_path}"], env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    def answers() -> bool:
        try:
            urllib.request.urlopen(f"{url}/api/status?token=t0ken", timeout=2).read()
            return True
        except (urllib.error.URLError, OSError):
            assert server.poll() is None, log.read_text()[-2000:]
            return False

    try:
        wait_until(answers, 60, what=lambda: f"the Lab server to answer: {log.read_text()[-2000:]}")
        yield url, log
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.integration
def test_a_users_server_starts_without_scanning_for_language_servers(tmp_path):
    """A spawn pays for no work the first page does not need: jupyter-lsp's scan for
    language servers (``npm prefix -g`` and a look for 19 programs, none of which PDL
    ships) is off (PDL's jupyter_server_config.d/pdl.json)."""
    with lab_server(tmp_path) as (url, log):
        with pytest.raises(urllib.error.HTTPError) as lsp:
            urllib.request.urlopen(f"{url}/lsp/status?token=t0ken", timeout=10)
        assert lsp.value.code == 404
    text = log.read_text()
    assert "language server" not in text.lower() and "Skipped non-installed server" not in text, text[-2000:]


@pytest.mark.integration
def test_a_users_server_starts_and_serves_the_lab_without_running_node(tmp_path):
    """JupyterLab asked node for yarn's registry (``node yarn.js config --json``) at every
    server's start, twice (at its import and for its server's options), for builds a
    user's server never makes (pdl_server/jupyter_process.py). A stand-in ``node`` first
    on the server's PATH records every call: none, up to the Lab's first page."""
    real_node = shutil.which("node")
    if real_node is None:
        pytest.skip("needs node (JupyterLab's calls go to it only where it is installed)")
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    calls = tmp_path / "node-calls"
    (stand_in / "node").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real_node} "$@"\n')
    (stand_in / "node").chmod(0o755)
    with lab_server(tmp_path, path_first=stand_in) as (url, log):
        page = urllib.request.urlopen(f"{url}/lab?token=t0ken", timeout=30)
        assert page.status == 200 and b"jupyter-config-data" in page.read()
    assert not calls.exists(), f"the server ran node: {calls.read_text()}"
