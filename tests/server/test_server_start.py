"""What the user's server, the hub and the admin view load when they start.

Every spawn starts a Jupyter server (and every hub start a hub): what they import is
paid in CPU seconds by each of them, on the machine every user shares.
"""

from __future__ import annotations

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
