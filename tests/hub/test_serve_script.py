"""``bash scripts/serve``, the README's first command, tells the admin how to log in the
way the hub's login works: PDL's own password and sign-up links for PDL_AUTH=native,
and no PDL password (none is made) for the lab's own logins; and its Ctrl-C stops
everything it started in seconds. docs/admin.md's systemd unit for the hub is valid,
and stopping it as systemd does (SIGTERM to its main process) is as quick."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests

from hub_harness import (
    REPO, free_port, open_path_to, pids_of_uid, remove_account, server_ports, user_processes,
)
from pdl.process import pid_alive
from pdl_spawner.accounts.unix_accounts import account_exists
from pdl_spawner.core.reservations import SlotLedger
from waiting import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="several users and the lab's accounts need a hub run as root")


def serve_says(tmp_path, **env) -> str:
    """What scripts/serve prints before the hub's own log, then the hub stopped."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PDL_")}
    ports = {name: str(free_port()) for name in ("PDL_HUB_PORT", "PDL_HUB_INTERNAL_PORT", "PDL_PROXY_API_PORT",
                                                 "PDL_ADMIN_VIEW_PORT")}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen(["bash", "scripts/serve"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                 env={**clean, **ports, "PDL_STATE_DIR": str(tmp_path / "state"), **env},
                                 start_new_session=True)
    try:
        # until the hub runs: a Ctrl-C while it starts its proxy (a session of its own) left
        # that proxy running, its port held, after the test
        deadline = time.monotonic() + 120
        while "JupyterHub is now running" not in log.read_text() and time.monotonic() < deadline:
            assert serve.poll() is None, log.read_text()
            time.sleep(0.2)
    finally:
        os.killpg(serve.pid, signal.SIGINT)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
    return log.read_text().split("Ctrl-C stops the hub")[0]


def test_the_lab_login_is_announced_without_a_pdl_password_or_sign_up_links(tmp_path):
    said = serve_says(tmp_path, PDL_AUTH="ldap", PDL_LDAP_URL="ldap://127.0.0.1:1",
                      PDL_LDAP_USER_DN="uid={username},ou=people,dc=lab,dc=test", PDL_ACCOUNTS="lab",
                      PDL_ALLOWED_GROUP="ml", PDL_USERS="ann,ben")
    assert "Log in as:  ann (the admin), with the lab's own password (ldap)" in said, said
    assert "Who else may log in: ann,ben, and the members of the Unix group ml" in said, said
    assert "Password:" not in said and "signup" not in said, said
    assert not (tmp_path / "state" / "password").exists()
    assert f"upload {REPO}/notebooks/cinic10_distributed.ipynb to your server" in said, said  # not in their home


def test_pdls_own_login_is_announced_with_the_admins_password_and_the_sign_up_links(tmp_path):
    said = serve_says(tmp_path, PDL_USERS="ann,ben")
    password = (tmp_path / "state" / "password").read_text().strip()
    assert f"Log in as:  ann\n  Password:   {password}" in said, said
    assert "Sign-up link for ben" in said, said
    assert "open notebooks/cinic10_distributed.ipynb (it is in your home as well)" in said, said


#: The most seconds Ctrl-C may take to stop the hub, its proxy and services, and every
#: server it started with their engines (issue 48).
STOP_S = 10.0


#: Where docs/admin.md's unit has PDL; the tests put this checkout in its place.
UNIT_PREFIX = "/opt/pdl"
#: The PATH systemd gives a system service.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def docs_unit() -> str:
    """docs/admin.md's systemd unit for the hub, with this checkout in place of /opt/pdl."""
    text = (REPO / "docs" / "admin.md").read_text()
    block = text.split("`/etc/systemd/system/pdl-hub.service`:\n\n```ini\n", 1)[1].split("```", 1)[0]
    return block.replace(UNIT_PREFIX, str(REPO))


def unit_values(unit: str, key: str) -> list[str]:
    """The values of the unit's ``key=`` lines, in order."""
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}=")]


def test_the_docs_systemd_unit_for_the_hub_is_valid(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None and not os.environ.get("CI"):
        pytest.skip("no systemd-analyze (Debian's systemd; scripts/setup --test installs it)")
    unit = tmp_path / "pdl-hub.service"
    unit.write_text(docs_unit())
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, ""), done
    assert unit_values(docs_unit(), "KillMode") == ["mixed"] and unit_values(docs_unit(), "KillSignal") == ["SIGTERM"]
    # and it is checked: a unit with a mistake in it is refused, in a line naming it
    unit.write_text(docs_unit().replace("KillMode=mixed", "KillMode=gently"))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "Failed to parse kill mode specification, ignoring: gently" in done.stderr, done


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("started", ["in a terminal", "in the background", "by systemd"])
def test_ctrl_c_stops_the_hub_and_a_server_with_2_workers_within_10_s(tmp_path, started):
    """Ctrl-C in ``scripts/serve``'s terminal (SIGINT to its process group), while ann's
    server runs with 2 workers: within :data:`STOP_S` no process of the hub, its proxy, its
    services or ann's server and engines is left, and her workers are free. The same for
    SIGINT to a hub started in the background of a script (``bash scripts/serve &``), which
    starts with SIGINT ignored: its services must not inherit that; and for docs/admin.md's
    systemd unit, its ``ExecStart`` run with its environment (the test's settings as its
    ``EnvironmentFile``, ``PDL_KEEP_SERVERS=0``) and stopped as systemd stops it: SIGTERM to
    the main process alone (``KillMode=mixed``; nothing may be left for its SIGKILL)."""
    token, prefix = secrets.token_hex(16), f"t{secrets.token_hex(2)}-"
    local_config = tmp_path / "hub_config.py"
    local_config.touch(mode=0o600)
    local_config.write_text(f"""
c.JupyterHub.services.append({{"name": "tests", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "tests", "scopes": ["admin:servers", "read:users"], "services": ["tests"]}})
c.HostServer.account_prefix = {prefix!r}
c.HostServer.homes_root = {str(tmp_path / 'homes')!r}
""")
    (tmp_path / "homes").mkdir()
    open_path_to(tmp_path / "homes")
    ports = {name: str(free_port()) for name in ("PDL_HUB_PORT", "PDL_HUB_INTERNAL_PORT", "PDL_PROXY_API_PORT",
                                                 "PDL_ADMIN_VIEW_PORT")}
    settings = {**ports, "PDL_STATE_DIR": str(tmp_path / "state"), "PDL_USERS": "ann",
                "PDL_POOL": "cpu:0,cpu:1", "PDL_PORT_RANGE": "{}-{}".format(*server_ports()),
                "PDL_LOCAL_CONFIG": str(local_config)}
    if started == "by systemd":
        unit = docs_unit()
        command, cwd = unit_values(unit, "ExecStart"), unit_values(unit, "WorkingDirectory")[0]
        env = {"PATH": SYSTEMD_PATH, **dict(value.split("=", 1) for value in unit_values(unit, "Environment")),
               **settings, "PDL_KEEP_SERVERS": "0"}
    else:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PDL_")}
        command, cwd, env = ["bash", "scripts/serve"], REPO, {**clean, **settings}
    log = tmp_path / "serve.log"
    api = f"http://127.0.0.1:{ports['PDL_HUB_PORT']}/hub/api"
    headers = {"Authorization": f"token {token}"}
    with open(log, "wb") as out:
        serve = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True,
                                 preexec_fn=_ignore_sigint if started == "in the background" else None)
    account = f"{prefix}ann"
    try:
        wait_until(lambda: "Ctrl-C stops the hub" in log.read_text() or serve.poll() is not None, 120,
                   what="the hub to start")
        assert serve.poll() is None, log.read_text()[-3000:]

        def answers() -> bool:
            assert serve.poll() is None, log.read_text()[-3000:]
            try:
                return requests.get(f"{api}/", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(answers, 120, what="the hub's API")
        r = requests.post(f"{api}/users/ann/server", json={"workers": 2}, headers=headers, timeout=60)
        assert r.status_code in (201, 202), r.text

        def ready() -> bool:
            servers = requests.get(f"{api}/users/ann", headers=headers, timeout=30).json().get("servers", {})
            return bool(servers.get("", {}).get("ready"))

        wait_until(ready, 120, what="ann's server")
        home = Path(pwd.getpwnam(account).pw_dir)
        wait_until(lambda: list(user_processes(home).values()).count("engine") == 2, 120, what="ann's 2 engines")
        uid = pwd.getpwnam(account).pw_uid
        hub_side = [serve.pid, *(p.pid for p in psutil.Process(serve.pid).children(recursive=True))]
        assert len(hub_side) >= 4, "the hub, its proxy, its admin view and ann's server"

        started_stop = time.monotonic()
        if started == "by systemd":
            os.kill(serve.pid, signal.SIGTERM)
        else:
            os.killpg(serve.pid, signal.SIGINT)
        left = []

        def all_gone() -> bool:
            left[:] = [pid for pid in hub_side if pid_alive(pid)] + pids_of_uid(uid)
            return serve.poll() is not None and not left

        wait_until(all_gone, 60, what=lambda: f"everything to stop; left: {left}")
        took = time.monotonic() - started_stop
        assert took <= STOP_S, f"stopping took {took:.1f} s:\n{log.read_text()[-3000:]}"
        assert SlotLedger(tmp_path / "state" / "reservations.sqlite").holdings() == []
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
        if account_exists(account):
            for pid in pids_of_uid(pwd.getpwnam(account).pw_uid):
                os.kill(pid, signal.SIGKILL)
            remove_account(account)

