"""Every setting an admin needs, in one place: the users' port range, the admin's own
config file (loaded only when nobody but root or the hub's user can change it), and
docs/admin.md's table of every PDL_* variable jupyterhub_config.py reads.

The config is loaded as ``scripts/serve`` checks it (traitlets' PyFileConfigLoader, in a
subprocess): no hub is started."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdl_spawner.core.hub_settings import local_config_problem, port_range

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


# -- PDL_PORT_RANGE ----------------------------------------------------------------------

def test_a_port_range_is_low_dash_high():
    assert port_range("20000-32000") == (20000, 32000)
    assert port_range(" 1024-65535 ") == (1024, 65535)


@pytest.mark.parametrize("bad", ["", "20000", "20000-", "-32000", "a-b", "80-90", "1000-2000", "30000-20000",
                                 "20000-20000", "20000-70000", "20000:32000", "20000-32000-40000"])
def test_a_bad_port_range_is_one_line_naming_what_is_valid(bad):
    with pytest.raises(ValueError) as info:
        port_range(bad)
    message = str(info.value)
    assert message.startswith("PDL_PORT_RANGE must be LOW-HIGH with 1024 <= LOW < HIGH <= 65535")
    assert message.endswith(f"got {bad!r}") and "\n" not in message


# -- the local config file: who can change it ------------------------------------------------

def config_file(folder: Path, mode: int = 0o644) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hub_config.py"
    path.write_text("c.PDLSlurmSpawner.time_limit = 480\n")
    path.chmod(mode)
    return path


def test_a_file_only_its_owner_can_change_is_safe(tmp_path):
    assert local_config_problem(config_file(tmp_path / "etc")) is None
    assert local_config_problem(config_file(tmp_path / "private", mode=0o600)) is None


def test_a_file_group_or_others_can_write_is_refused(tmp_path):
    for mode in (0o664, 0o646):
        problem = local_config_problem(config_file(tmp_path / f"m{mode:o}", mode=mode))
        assert problem and "writable by group or others" in problem and "chmod go-w" in problem, problem
        assert "\n" not in problem


def test_a_file_in_a_folder_others_can_write_is_refused_unless_the_folder_is_sticky(tmp_path):
    open_folder = tmp_path / "open"
    path = config_file(open_folder)
    open_folder.chmod(0o777)  # anyone could replace hub_config.py with their own
    problem = local_config_problem(path)
    assert problem and f"its folder {open_folder} is writable by group or others" in problem, problem
    sticky = tmp_path / "tmp"
    path = config_file(sticky)
    sticky.chmod(0o1777)  # like /tmp: others may add files, not replace the hub's
    assert local_config_problem(path) is None


def test_a_file_in_a_safe_folder_below_an_open_one_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    path = config_file(tmp_path / "open" / "pdl")
    (tmp_path / "open").chmod(0o777)  # whoever can write here can rename pdl/ and put their own
    problem = local_config_problem(path)
    assert problem and f"its folder {tmp_path / 'open'} is writable" in problem, problem


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_or_folder_of_another_user_is_refused(tmp_path):
    path = config_file(tmp_path / "theirs")
    os.chown(path, NOBODY, NOBODY)  # mode 0644, but its owner can change it
    problem = local_config_problem(path)
    assert problem == f"{path} belongs to uid {NOBODY}, not to root or the hub's user: chown root it"
    path = config_file(tmp_path / "their-folder")
    os.chown(path.parent, NOBODY, NOBODY)
    problem = local_config_problem(path)
    assert problem and f"its folder {path.parent} belongs to uid {NOBODY}" in problem, problem


def test_a_symlink_or_a_folder_is_refused(tmp_path):
    target = config_file(tmp_path / "real")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    assert local_config_problem(link) == f"{link} is a symbolic link: name the file itself"
    assert local_config_problem(tmp_path / "real") == f"{tmp_path / 'real'} is not a regular file"
    assert local_config_problem(tmp_path / "missing.py") == f"{tmp_path / 'missing.py'} does not exist"


def test_a_safe_file_reached_through_a_link_to_an_open_folder_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    config_file(open_folder)
    open_folder.chmod(0o777)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "pdl").symlink_to(open_folder)  # the path looks safe; where it leads is not
    problem = local_config_problem(tmp_path / "etc" / "pdl" / "hub_config.py")
    assert problem and f"its folder {open_folder} is writable" in problem, problem


# -- jupyterhub_config.py with the local config file ------------------------------------------

def load_config(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Load jupyterhub_config.py as ``scripts/serve`` checks it; prints the settings asked about as JSON."""
    script = """
import json, sys
from traitlets.config.loader import PyFileConfigLoader
c = PyFileConfigLoader("jupyterhub_config.py", path=sys.argv[1]).load_config()
services = c.JupyterHub.services.get_value([])  # appended to: a LazyConfigValue until a hub applies it
admin_view = next(s for s in services if s["name"] == "pdl-admin")
print(json.dumps({"port": c.JupyterHub.port, "time_limit": c.PDLSlurmSpawner.get("time_limit"),
                  "host_ports": c.HostServer.get("port_range"), "swarm_ports": c.PDLSwarmSpawner.get("port_range"),
                  "session_limit_s": c.PDLLocalSpawner.get("session_limit_s"),
                  "session_warning_s": c.PDLLocalSpawner.get("session_warning_s"),
                  "services": [s["name"] for s in services], "user_env": c.Spawner.get("environment"),
                  "admin_view_pool": admin_view["environment"].get("PDL_POOL")}))
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


def test_the_admins_config_file_wins_and_the_admin_view_sees_its_settings(tmp_path):
    path = config_file(tmp_path / "etc")
    path.write_text('c.PDLSlurmSpawner.time_limit = 480\nc.JupyterHub.port = 8123\n'
                    'c.PDLLocalSpawner.pool = ["cpu:0", "cpu:1"]\n'
                    'c.JupyterHub.services.append({"name": "lab-extra", "command": ["true"]})\n')
    got = settings(load_config(tmp_path, PDL_LOCAL_CONFIG=str(path), PDL_HUB_PORT="8000", PDL_POOL="cpu:0"))
    assert (got["time_limit"], got["port"]) == (480, 8123)  # over PDL_HUB_PORT too
    assert got["admin_view_pool"] == "cpu:0,cpu:1"  # the admin view is told the final pool
    assert {"idle-culler", "pdl-admin", "lab-extra"} <= set(got["services"])  # added to, not replaced


def test_pdl_balance_reaches_every_users_server_and_a_bad_one_stops_the_hub_in_one_line(tmp_path):
    got = settings(load_config(tmp_path, PDL_BALANCE="off", PDL_PREFLIGHT_SKIP="gpu"))
    assert got["user_env"] == {"PDL_BALANCE": "off", "PDL_PREFLIGHT_SKIP": "gpu"}
    assert settings(load_config(tmp_path))["user_env"] is None  # unset: each server's own default, auto
    assert refusal(load_config(tmp_path, PDL_BALANCE="sometimes")) == (
        "PDL_BALANCE must be one of auto, on, off, got 'sometimes'")


def test_an_unsafe_config_file_stops_the_hub_in_one_line(tmp_path):
    path = config_file(tmp_path / "etc", mode=0o666)
    path.write_text("c.PDLSlurmSpawner.time_limit = 1\n")
    line = refusal(load_config(tmp_path, PDL_LOCAL_CONFIG=str(path)))
    assert line == ("PDL_LOCAL_CONFIG: not loaded, since the hub runs it as its own code: "
                    f"{path} is writable by group or others (mode 666): chmod go-w it")


def test_a_named_config_file_that_is_missing_stops_the_hub_and_none_at_all_is_fine(tmp_path):
    line = refusal(load_config(tmp_path, PDL_LOCAL_CONFIG=str(tmp_path / "nope.py")))
    assert line.startswith(f"PDL_LOCAL_CONFIG names {tmp_path / 'nope.py'}, which does not exist")
    if not os.path.lexists("/etc/pdl/hub_config.py"):  # the default: loaded only when present
        assert settings(load_config(tmp_path))["time_limit"] is None


def test_pdl_port_range_sets_the_servers_ports_or_stops_in_one_line(tmp_path):
    got = settings(load_config(tmp_path, PDL_PORT_RANGE="21000-21999"))
    assert got["host_ports"] == got["swarm_ports"] == [21000, 21999]
    assert settings(load_config(tmp_path))["host_ports"] is None  # the traits' default, 20000-32000
    line = refusal(load_config(tmp_path, PDL_PORT_RANGE="80-90"))
    assert line == "PDL_PORT_RANGE must be LOW-HIGH with 1024 <= LOW < HIGH <= 65535 (e.g. 20000-32000), got '80-90'"


def test_pdl_session_limit_s_sets_the_longest_session_or_stops_in_one_line(tmp_path):
    got = settings(load_config(tmp_path, PDL_SESSION_LIMIT_S="28800", PDL_SESSION_WARN_S="300"))
    assert (got["session_limit_s"], got["session_warning_s"]) == (28800, 300)
    assert settings(load_config(tmp_path))["session_limit_s"] == 0  # off by default
    line = refusal(load_config(tmp_path, PDL_SESSION_LIMIT_S="8h"))
    assert line == ("jupyterhub_config.py: PDL_SESSION_LIMIT_S must be a number of seconds >= 0 "
                    "(e.g. 28800 for 8 h; 0: off), got '8h'")


# -- docs/admin.md's table ----------------------------------------------------------------

def variables_read(source: str) -> set[str]:
    """The PDL_* names a Python file reads from its environment: ``os.environ.get(NAME)``,
    ``os.environ[NAME]``, ``NAME in os.environ``."""
    def is_environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    found = set()
    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and is_environ(node.func.value) and node.args:
            name = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            name = node.slice
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            name = node.left
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("PDL_"):
            found.add(name.value)
    return found


def documented_variables() -> set[str]:
    text = (REPO / "docs" / "admin.md").read_text()
    section = text.split("\n## Every setting, in one place\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(PDL_[A-Z0-9_]+)`", section, flags=re.M))


def test_the_admin_guide_lists_every_variable_the_hub_config_reads_and_no_other():
    read = variables_read((REPO / "jupyterhub_config.py").read_text())
    assert {"PDL_STATE_DIR", "PDL_PORT_RANGE", "PDL_LOCAL_CONFIG", "PDL_ADMIN_VIEW_PORT"} <= read  # the parser sees them
    listed = documented_variables()
    assert sorted(read - listed) == [], "read by jupyterhub_config.py, missing from docs/admin.md's table"
    assert sorted(listed - read) == [], "in docs/admin.md's table, never read by jupyterhub_config.py"
