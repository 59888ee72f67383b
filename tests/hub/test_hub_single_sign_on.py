"""The lab's single sign-on through a real hub (PDL_AUTH=oidc): a real OpenID Connect
provider on 127.0.0.1 (npm's certified ``oidc-provider``, tests/harness/oidc_provider.py)
with the lab's people, oauthenticator's generic authenticator as its client, and a real
Chromium that opens the hub, follows its "Sign in" to the provider's login page, and
comes back logged in. The person then gets a server and a cell on 2 workers that run as
their own account; a member of the allowed group at the provider gets in unlisted;
someone neither listed nor in it, a name that cannot be a hub user's, and a wrong
password at the provider get no hub session."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets

import pytest

import oidc_provider
from browser_harness import chromium_page
from hub_harness import Hub, Kernel, running, runs_as_root, user_processes

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(oidc_provider.install_problem() is not None and not os.environ.get("CI"),
                                 reason=str(oidc_provider.install_problem())),
              pytest.mark.skipif(not runs_as_root() and not os.environ.get("CI"),
                                 reason="users get their own accounts only when the hub runs as root")]

POOL = ["cpu:0", "cpu:1"]
USERS = ["ann", "ben"]
CLIENT_ID = "pdl-hub"


class SignOnHub(Hub):
    """A hub whose people log in at the lab's provider: nobody signs up here."""

    def sign_up_listed_users(self) -> None:
        """Nobody signs up: the provider knows the people."""


@pytest.fixture(scope="module")
def sso(tmp_path_factory):
    """The provider with ``ann`` and ``ben`` (listed on the hub), ``dan`` (not), ``eve``
    (whose name is ``Eve Smith``) and ``fay`` (not listed, in the provider's group ``ml``),
    each with a password; the hub its client, letting in the group ``ml`` too."""
    root = tmp_path_factory.mktemp("sso-hub")
    secret = secrets.token_urlsafe(24)
    hub = SignOnHub(root, USERS, POOL)
    people = {login: {"password": secrets.token_urlsafe(12),
                      "claims": {"sub": f"id-{login}", "preferred_username": name, "email": f"{login}@lab.test",
                                 "groups": ["ml"] if login == "fay" else ["staff"]}}
              for login, name in (("ann", "ann"), ("ben", "ben"), ("dan", "dan"), ("eve", "Eve Smith"),
                                  ("fay", "fay"))}
    client = {"client_id": CLIENT_ID, "client_secret": secret, "redirect_uris": [f"{hub.url}/hub/oauth_callback"]}
    with oidc_provider.provider(root, people, [client]) as provider:
        secret_file = root / "client-secret"
        secret_file.write_text(secret)
        secret_file.chmod(0o600)
        hub.hub_env.update({"PDL_AUTH": "oidc", "PDL_OIDC_ISSUER": provider.issuer, "PDL_OIDC_CLIENT_ID": CLIENT_ID,
                            "PDL_OIDC_CLIENT_SECRET_FILE": str(secret_file), "PDL_ALLOWED_GROUP": "ml"})
        with running(hub) as started:
            yield started, people


@pytest.fixture
def page(tmp_path):
    with chromium_page(tmp_path) as page:
        yield page


def sign_in(hub, page, login: str, password: str) -> str:
    """Open the hub's login page, follow its sign-in to the provider, fill the provider's
    form; the URL the browser ends on."""
    page.goto(f"{hub.url}/hub/login")
    page.click("text=Sign in with the lab's sign-on")
    page.wait_for_selector("#login", timeout=30_000)
    page.fill("#login", login)
    page.fill("#password", password)
    page.click("#submit")
    page.wait_for_load_state("networkidle", timeout=30_000)
    return page.url


def hub_session(page) -> bool:
    return any(c["name"] == "jupyterhub-hub-login" for c in page.context.cookies())


def test_a_person_signs_in_at_the_labs_provider_and_a_cell_runs_on_two_workers_as_their_account(sso, page):
    hub, people = sso
    url = sign_in(hub, page, "ben", people["ben"]["password"])
    assert hub_session(page) and re.search(r"/hub/(spawn|home)|/user/ben/", url), url
    r = hub.spawn("ben", 2)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ben")
    uid = pwd.getpwnam(hub.account("ben")).pw_uid
    kernel = Kernel(hub, "ben")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok("%%distributed -n 2\nimport json, os, torch.distributed as dist\n"
                                "seen = [None] * world_size\n"
                                "dist.all_gather_object(seen, os.getuid())\n"
                                "print(json.dumps(seen))")
        assert json.loads(out["stdout"].strip().splitlines()[-1]) == [uid, uid], out
        processes = user_processes(hub.home("ben"))
        assert sum(role == "engine" for role in processes.values()) == 2, processes
    finally:
        kernel.close()
    assert hub.api("DELETE", "/users/ben/server").status_code in (202, 204)


@pytest.mark.parametrize("login", ["dan", "eve"])
def test_someone_unlisted_or_with_a_name_no_hub_user_can_have_gets_no_session(sso, page, login):
    """dan is known to the provider, not listed on the hub; eve's name (``Eve Smith``)
    cannot be a hub user's (PDLOIDCAuthenticator.validate_username)."""
    hub, people = sso
    sign_in(hub, page, login, people[login]["password"])
    assert not hub_session(page), page.url
    assert login not in [u["name"] for u in hub.api("GET", "/users").json()]


def test_a_member_of_the_allowed_group_at_the_provider_signs_in_unlisted(sso, page):
    hub, people = sso
    sign_in(hub, page, "fay", people["fay"]["password"])
    assert hub_session(page), page.url
    assert "fay" in [u["name"] for u in hub.api("GET", "/users").json()]


def test_a_wrong_password_at_the_provider_gets_no_session(sso, page):
    hub, _ = sso
    sign_in(hub, page, "ann", "not-her-password")
    assert "wrong login or password" in page.inner_text("body")
    assert not hub_session(page)
