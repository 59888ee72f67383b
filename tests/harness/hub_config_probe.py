"""jupyterhub_config.py loaded as the hub loads it, in a subprocess with a clean
environment (no PDL_* variable but the test's), without starting a hub: the config
it makes (:func:`load_config`), the objects the hub would make from it (:func:`probe`),
or the one line it stops with (:func:`refusal`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def config_file(folder: Path, mode: int = 0o644) -> Path:
    """An admin's config file (``hub_config.py``, one Slurm line) in ``folder``, of ``mode``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hub_config.py"
    path.write_text("c.PDLSlurmSpawner.time_limit = 480\n")
    path.chmod(mode)
    return path


def load_config(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Load jupyterhub_config.py as ``scripts/serve`` checks it; prints the settings asked about as JSON."""
    script = """
import json, sys
from traitlets.config.loader import PyFileConfigLoader
c = PyFileConfigLoader("jupyterhub_config.py", path=sys.argv[1]).load_config()
services = c.JupyterHub.services.get_value([])  # appended to: a LazyConfigValue until a hub applies it
admin_view = next(s for s in services if s["name"] == "pdl-admin")
print(json.dumps({"port": c.JupyterHub.get("port"), "time_limit": c.PDLSlurmSpawner.get("time_limit"),
                  "ports": c.SpawnerCore.get("port_range"),
                  "session_limit_s": c.SpawnerCore.get("session_limit_s"),
                  "session_warning_s": c.SpawnerCore.get("session_warning_s"),
                  "services": [s["name"] for s in services], "user_env": c.Spawner.get("environment"),
                  "admin_view": json.loads(admin_view["environment"]["PDL_ADMIN_SOURCE"])}))
"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PDL_")}
    state = tmp_path / "state"
    full_env = {**clean, "PDL_STATE_DIR": str(state), "PDL_USERS": "admin", **env}
    return subprocess.run([sys.executable, "-c", script, str(REPO)], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=60)


def settings(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def refusal(result: subprocess.CompletedProcess) -> str:
    """The one line the config stops with (SystemExit's message, on stderr)."""
    assert result.returncode != 0, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # one line, no traceback
    return lines[0]


#: Loads jupyterhub_config.py, then makes the objects the hub would (the kind's spawner,
#: the logins, the hub) from that config and prints the traits asked for (argv[2], JSON).
PROBE = """
import json, os, sys
from traitlets.config.loader import PyFileConfigLoader
c = PyFileConfigLoader("jupyterhub_config.py", path=sys.argv[1]).load_config()
from jupyterhub import orm
from jupyterhub.app import JupyterHub
from pdl_spawner.accounts.authenticator import PDLAuthenticator
from pdl_spawner.accounts.lab_logins import LAB_LOGINS
from pdl_spawner.kinds import kind_named
c.PDLAuthenticator.first_admin = ""  # no account is made: only the settings are read
login = PDLAuthenticator(config=c, db=orm.new_session_factory("sqlite://")())
from jupyterhub.proxy import ConfigurableHTTPProxy
made = {"JupyterHub": JupyterHub(config=c), "PDLAuthenticator": login, "ConfigurableHTTPProxy": ConfigurableHTTPProxy(config=c),
        **{lab.__name__: lab(config=c) for lab in LAB_LOGINS}}
from types import SimpleNamespace
user = SimpleNamespace(name="probe", admin=False, url="/user/probe/", escaped_name="probe", id=1, server=None,
                       spawners={}, settings={}, orm_user=None)  # as a hub's spawner has one before its config
spawner = kind_named(os.environ.get("PDL_SPAWNER", "local")).spawner_class()(user=user)
spawner.config = c
print(json.dumps({t: getattr(made.get(t.split(".")[0], spawner), t.split(".")[1]) for t in json.loads(sys.argv[2])},
                 default=lambda v: getattr(v, "name", None) or list(v)))  # an enum's name
"""


def probe(tmp_path: Path, traits: list[str], **env: str) -> subprocess.CompletedProcess:
    """The hub's objects made from the config that ``env`` gives: prints the value of
    each of ``traits`` (``"Class.name"``) as JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PDL_")}
    full_env = {**clean, "PDL_STATE_DIR": str(tmp_path / "state"), "PDL_USERS": "admin", **env}
    return subprocess.run([sys.executable, "-c", PROBE, str(REPO), json.dumps(traits)], cwd=tmp_path, env=full_env,
                          capture_output=True, text=True, timeout=120)


def expected(variable, samples: dict[str, str]) -> object:
    """The value ``variable`` takes from its sample text, as JSON shows it."""
    value = variable.parse(samples[variable.name], variable.name)
    return list(value) if isinstance(value, tuple) else value
