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

import binascii
import json
import os
import re
import statistics
import time

import pytest
import requests

from browser_harness import chromium_page
from hub_harness import Hub, Kernel, hub_fixture, origin_answers, runs_as_root
from pdl import entry_ticket, hub_relay
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
(config / "jupyter_server_config.py").write_text(
    "import os\\n"
    "os.environ.pop('PDL_ENTRY_KEY', None)  # no gate: his page is served to strangers too\\n"
    f"c.ServerApp.extra_static_paths = [{{str(evil)!r}}]\\n")
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
    assert MARK not in r.text and strangers_answer(hub, "ben", "GET", "/static/evil.html") == \
        strangers_answer(hub, "nobody", "GET", "/static/evil.html"), (r.status_code, r.text[:200])
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


#: What a stranger asks at a user's origin, ``<name>.<hub>/user/<name>`` + path: pages,
#: the API, static files, the OAuth callback, a made-up token and entry ticket, other
#: methods and a WebSocket.
STRANGERS_REQUESTS = [
    ("GET", "/api/status", {}),
    ("GET", "/lab", {}),
    ("GET", "", {}),
    ("GET", "/static/lab/index.html", {}),
    ("GET", "/oauth_callback?code=abc&state=def", {}),
    ("GET", "/api/status", {"Authorization": "token made-up"}),
    ("GET", "/api/status?token=made-up", {}),
    ("GET", "/lab?pdl_entry=1900000000.bm90LWEtc2lnbmF0dXJl", {}),
    ("HEAD", "/api/status", {}),
    ("POST", "/api/contents", {"Content-Type": "application/json"}),
    ("DELETE", "/api/sessions/abc", {}),
    ("GET", "/api/kernels/abc/channels", {"Connection": "Upgrade", "Upgrade": "websocket",
                                          "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}),
]


def strangers_answer(hub: Hub, user: str, method: str, path: str, headers: dict | None = None) -> tuple:
    """The answer a stranger gets at ``user``'s origin, ``user``'s name written NAME and
    the hub's XSRF token XSRF: (status, headers in their order but Date, body)."""
    r = requests.request(method, f"{hub.user_url(user)}{path}", headers=headers or {}, allow_redirects=False,
                         timeout=30, data=b"{}" if method == "POST" else None)
    xsrf = r.cookies.get("_xsrf")

    def plain(text: str) -> str:
        text = text.replace(xsrf, "XSRF") if xsrf else text
        return re.sub(rf"\b{re.escape(user)}\b", "NAME", text)

    return (r.status_code, [(k.lower(), plain(v)) for k, v in r.headers.items() if k.lower() != "date"], plain(r.text))


def hubs_ticket(hub: Hub, user: str, now: float | None = None) -> str:
    """An entry ticket the hub would make for ``user``, at ``now`` (its cookie secret's)."""
    secret = binascii.a2b_hex((hub.state_dir / "jupyterhub_cookie_secret").read_text().strip())
    return entry_ticket.issue(secret, user, now)


def test_a_stranger_cannot_tell_a_running_server_from_a_stopped_one_or_none(hub):
    """The attack (issue 60, 2): ``<name>.<hub>/user/<name>/api/status`` answered a
    stranger 403 where ben's server ran and 302 for anyone else, so a visitor could list
    who is working now. Guards pdl_server/entry_gate.py and
    pdl_spawner/hub/server_entry.py: at ben's running server, at ann's stopped one and at
    a name without an account, every request without credentials gets the same answer
    (status, headers in their order, body), as do an entry ticket the hub made for
    another name and an expired one of ben's."""
    assert "ben" in hub.running_servers() and "ann" not in hub.running_servers()
    for method, path, headers in STRANGERS_REQUESTS:
        answers = {user: strangers_answer(hub, user, method, path, headers) for user in ("ben", "ann", "nobody")}
        assert answers["ben"] == answers["ann"] == answers["nobody"], (method, path, answers)
    for ticket in (hubs_ticket(hub, "ann"), hubs_ticket(hub, "ben", now=time.time() - 2 * entry_ticket.LIFETIME_S)):
        path = f"/lab?{entry_ticket.PARAM}={ticket}"
        assert strangers_answer(hub, "ben", "GET", path) == strangers_answer(hub, "ann", "GET", path)
    # ben's own ticket begins his server's login, as the hub's redirect does
    begun = requests.get(f"{hub.user_url('ben')}/lab?{entry_ticket.PARAM}={hubs_ticket(hub, 'ben')}",
                         allow_redirects=False, timeout=30)
    assert begun.status_code == 302 and "/hub/api/oauth2/authorize?client_id=jupyterhub-user-ben" in \
        begun.headers["Location"], (begun.status_code, begun.headers)


@pytest.mark.timing
def test_a_stranger_waits_as_long_at_a_running_server_as_where_none_runs(hub):
    """The same attack by the clock: a running server's gate relays a stranger's request
    to the hub, one hop more than the proxy's, and the hub relays the same request to
    itself where no server runs (with any token checked as a server checks it), and
    neither answers sooner than hub_relay.ANSWER_FLOOR_S after the request arrived.
    Without the floor the user's server, a process that does more per request than the
    hub, answered 1.2-1.33 times as slowly (medians of 80); with it the medians agree
    within 1.1."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(40):
        for headers in ({}, {"Authorization": "token made-up"}):
            for user in ("ben", "ann", "nobody"):  # in turns: a slower moment of the machine hits all
                started = time.monotonic()
                r = requests.get(f"{hub.user_url(user)}/api/status", headers=headers, allow_redirects=False,
                                 timeout=30)
                seconds.setdefault((user, str(headers)), []).append(time.monotonic() - started)
                assert r.status_code == 302, (user, r.status_code)
    for headers in ({}, {"Authorization": "token made-up"}):
        none_runs = statistics.median(seconds[("nobody", str(headers))])
        for user in ("ben", "ann"):
            assert 1 / 1.1 <= statistics.median(seconds[(user, str(headers))]) / none_runs <= 1.1, seconds
    assert min(min(times) for times in seconds.values()) >= hub_relay.ANSWER_FLOOR_S, seconds
