"""What the user's server, the hub and the admin view load when they start.

Every spawn starts a Jupyter server (and every hub start a hub): what they import is
paid in CPU seconds by each of them, on the machine every user shares.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

#: The processes PDL starts per hub and per spawn, by the modules they run.
STARTED_PROCESSES = ("jupyterhub.app", "jupyterhub.singleuser", "pdl_server.singleuser",
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


@pytest.mark.integration
def test_a_users_server_starts_without_scanning_for_language_servers(tmp_path):
    """A spawn pays for no work the first page does not need: jupyter-lsp's scan for
    language servers (``npm prefix -g`` and a look for 19 programs, none of which PDL
    ships) is off (PDL's jupyter_server_config.d/pdl.json)."""
    import socket
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY"))}
    env.update(HOME=str(tmp_path), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
                                   "--ip=127.0.0.1", "--IdentityProvider.token=t0ken", "--allow-root",
                                   f"--ServerApp.root_dir={tmp_path}"], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=t0ken", timeout=2).read()
                break
            except (urllib.error.URLError, OSError):
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        with pytest.raises(urllib.error.HTTPError) as lsp:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/lsp/status?token=t0ken", timeout=10)
        assert lsp.value.code == 404
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text()
    assert "language server" not in text.lower() and "Skipped non-installed server" not in text, text[-2000:]
