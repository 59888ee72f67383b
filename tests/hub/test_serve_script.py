"""``bash scripts/serve``, the README's first command, tells the admin how to log in the
way the hub's login works: PDL's own password and sign-up links for PDL_AUTH=native,
and no PDL password (none is made) for the lab's own logins."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from hub_harness import REPO, free_port

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
        deadline = time.monotonic() + 120
        while "Ctrl-C stops the hub" not in log.read_text() and time.monotonic() < deadline:
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
