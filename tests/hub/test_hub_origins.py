"""The hostile neighbour's web pages: ben serves a page, ann opens it while logged in.

Each user's server is an origin of its own (``<name>.localhost``, JupyterHub's
``subdomain_host``, pdl_spawner/hub/public_url.py), and a user's own Jupyter config never
loads into their server (``disable_user_config``). Two real hubs, run as root as the
README's default is: the default one, where ben's ``~/.jupyter`` config is ignored; and
one where it loads (the fault injected at its seam: a user who controls what his server
serves, as he can by replacing it on its port), where ann's real Chromium opens ben's
page and the page tries to mint a token of hers, as it did when all servers shared the
hub's origin.
"""

from __future__ import annotations

import json
import os

import pytest
import requests

from browser_harness import chromium_page
from hub_harness import Hub, Kernel, hub_fixture, origin_answers, runs_as_root
from waiting import wait_until

pytestmark = [
    pytest.mark.hub,
    pytest.mark.skipif(not runs_as_root() and not os.environ.get("CI"),
                       reason="users get their own accounts only when the hub runs as root"),
]

USERS = ["admin", "ann", "ben"]
POOL = ["cpu:0", "cpu:1"]
MARK = "ben-was-here"
#: ben's page: it reads the hub's token page as its visitor, takes the XSRF token from
#: it and asks the hub for a token of ann's; it writes what it got into the page.
EVIL_PAGE = """<!doctype html><title>cats</title><body>MARK<script>
(async () => {
  const seen = {};
  try {
    const page = await fetch("HUB/hub/token", {credentials: "include"});
    const text = await page.text();
    seen.read = page.status;
    const xsrf = (text.match(/xsrf_token: "([^"]*)"/) || [])[1] || "";
    const made = await fetch("HUB/hub/api/users/ann/tokens", {method: "POST", credentials: "include",
      headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"}, body: JSON.stringify({note: "ben's"})});
    seen.minted = made.status;
  } catch (e) { seen.error = String(e); }
  try {  // a plain form post needs no read: the hub must refuse it without the token
    await fetch("HUB/hub/api/users/ann/tokens", {method: "POST", mode: "no-cors", credentials: "include",
      headers: {"Content-Type": "text/plain"}, body: "{}"});
  } catch (e) { seen.form_error = String(e); }
  document.body.dataset.seen = JSON.stringify(seen);
})();
</script></body>"""


def serve_bens_page(hub: Hub) -> str:
    """ben, from his kernel, writes his page and a Jupyter config that serves it without a
    login (``extra_static_paths``), then restarts his server; returns the page's URL."""
    kernel = Kernel(hub, "ben")
    try:
        kernel.execute_ok(f"""
import pathlib
from jupyter_core.paths import jupyter_config_dir
evil = pathlib.Path.home() / "evil"
evil.mkdir(exist_ok=True)
(evil / "evil.html").write_text({EVIL_PAGE.replace("MARK", MARK).replace("HUB", hub.url)!r})
config = pathlib.Path(jupyter_config_dir())
config.mkdir(parents=True, exist_ok=True)
(config / "jupyter_server_config.py").write_text(f"c.ServerApp.extra_static_paths = [{{str(evil)!r}}]\\n")
""")
    finally:
        kernel.close()
    assert hub.api("DELETE", "/users/ben/server").status_code in (202, 204)
    wait_until(lambda: "ben" not in hub.running_servers(), 60, what="ben's server to stop")
    assert hub.spawn("ben", 1).status_code in (201, 202)
    hub.wait_ready("ben")
    return f"{hub.user_url('ben')}/static/evil.html"


def start_ben(hub: Hub) -> Hub:
    assert hub.spawn("ben", 1).status_code in (201, 202)
    hub.wait_ready("ben")
    return hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # the embedded default's public URL: http://localhost:<port>, servers at <name>.localhost
    for hub in hub_fixture(tmp_path_factory.mktemp("origins-hub"), USERS, POOL, public_host="localhost"):
        yield start_ben(hub)


@pytest.fixture(scope="module")
def hub_serving_bens_config(tmp_path_factory):
    # the seam: ben's ~/.jupyter config loads, so his server serves what he likes
    for hub in hub_fixture(tmp_path_factory.mktemp("origins-hub-user-config"), USERS, POOL, public_host="localhost",
                           extra_config="c.Spawner.disable_user_config = False"):
        yield start_ben(hub)


def test_bens_own_jupyter_config_does_not_load_into_his_server(hub):
    """Guards jupyterhub_config.py's ``disable_user_config``: ben cannot add pages, handlers
    or extensions to his server that anyone may open without a login."""
    page = serve_bens_page(hub)
    r = requests.get(page, timeout=30, allow_redirects=False)
    assert r.status_code == 404 and MARK not in r.text, (r.status_code, r.text[:200])
    assert origin_answers(hub, "ben") == {"own": 200, "hub": 302}  # his server runs, at its own origin only
    # a link on the hub's own origin (/user/ben/...) leads ben to his server's
    moved = hub.login("ben").get(f"{hub.url}/user/ben/lab", timeout=60)
    assert moved.status_code == 200 and moved.url.startswith(f"{hub.user_url('ben')}/lab"), (moved.status_code, moved.url)


def test_a_page_ben_serves_cannot_mint_a_token_of_anns_who_opens_it(hub_serving_bens_config, tmp_path):
    """Guards jupyterhub_config.py's ``subdomain_host``: ben's page is another origin
    than the hub's, so it can neither read the hub's pages as ann nor post as her."""
    hub = hub_serving_bens_config
    page = serve_bens_page(hub)
    served = requests.get(page, timeout=30, allow_redirects=False)
    assert served.status_code == 200 and MARK in served.text, "the seam: ben's page must be served to anyone"
    before = len(hub.api("GET", "/users/ann/tokens").json()["api_tokens"])

    with chromium_page(tmp_path) as browser:
        browser.goto(f"{hub.url}/hub/login")
        browser.fill("#username_input", "ann")
        browser.fill("#password_input", hub.password("ann"))
        browser.click("#login_submit")
        browser.wait_for_url("**/hub/spawn**", timeout=30_000)
        assert browser.evaluate("fetch('/hub/token').then(r => r.status)") == 200  # ann is logged in
        browser.goto(page)
        browser.wait_for_selector("body[data-seen]", timeout=30_000)
        seen = json.loads(browser.get_attribute("body", "data-seen"))

    assert "read" not in seen and "minted" not in seen and "Failed to fetch" in seen.get("error", ""), seen
    assert len(hub.api("GET", "/users/ann/tokens").json()["api_tokens"]) == before, "a token of ann's was made"
