"""What a remote user does from their laptop (:mod:`laptop`), on any cluster kind: open
the hub's name over plain HTTP, be sent to HTTPS, log in, spawn workers, open a
notebook on their own server's origin and run a ``%%distributed`` cell in it, whose
output comes through the kernel's WebSocket. :func:`train_from_the_laptop` does it in
the laptop's Chromium and returns what a user (or the test) would look at: :class:`Visit`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from browser_harness import CHROMIUM_ARGS, require_chromium
from lab_tls import TestCA
from laptop import laptop as laptop_namespace

#: The lab's hub name in the tests (its users' servers under it), and its address.
HOST = "hub.lab.test"
URL = f"https://{HOST}"

#: The line rank 0 prints: ``rank 0 of <n> over TLS``.
RANK_LINE = "rank {rank} of {world} over TLS"


def cell(workers: int) -> str:
    return (f"%%distributed -n {workers}\nimport torch.distributed as dist\n"
            "print(f'rank {dist.get_rank()} of {dist.get_world_size()} over TLS')")


def notebook(cells: list[str]) -> dict:
    """A notebook (nbformat 4, as the contents API takes it) of these code cells."""
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": source} for i, source in enumerate(cells)]}


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    """A module's fixture (import it): the lab's :class:`~lab_tls.TestCA`."""
    return TestCA(tmp_path_factory.mktemp("lab-ca"))


@pytest.fixture(scope="module")
def laptop(tmp_path_factory, ca):
    """A module's fixture (import it): ann's :class:`~laptop.Laptop`, whose hosts file sends
    :data:`HOST` and ``ann.`` :data:`HOST` to the hub's end of its veth in the root
    namespace, its browser trusting ``ca``; skips without Chromium."""
    require_chromium()
    with laptop_namespace(tmp_path_factory.mktemp("laptop"), [HOST, f"ann.{HOST}"], ca.pem) as machine:
        yield machine


@dataclass
class Visit:
    """What the laptop's browser saw: the first page's address and headers (after the
    redirect from ``http://``) and status, the spawn form's text, the notebook's text after its
    cell ran, every cookie, every redirect's ``Location`` and each certificate,
    TLS or mixed-content error."""

    first_url: str = ""
    first_status: int = 0
    first_headers: dict = field(default_factory=dict)
    spawn_form: str = ""
    notebook_text: str = ""
    cookies: list = field(default_factory=list)
    redirects: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def train_from_the_laptop(laptop, hub, user: str, workers: int, failure_dir: Path) -> Visit:
    """``user`` opens ``http://<hub's name>/hub/login`` in the laptop's Chromium, logs in
    with their password, asks for ``workers`` on the spawn page, waits for their server
    at its own origin, and runs :func:`cell` in a notebook there (put by the contents API
    with the user's token, as an upload would). A full-page screenshot of a failure goes
    to ``failure_dir``."""
    playwright = require_chromium()
    host = urlsplit(hub.url).hostname
    visit = Visit()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(laptop.browser_command()), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.on("console", lambda m: visit.problems.append(m.text)
                if "Mixed Content" in m.text or "ERR_CERT" in m.text else None)
        page.on("requestfailed", lambda r: visit.problems.append(f"{r.url}: {r.failure}")
                if "ERR_CERT" in (r.failure or "") or "ERR_SSL" in (r.failure or "") else None)
        page.on("response", lambda r: visit.redirects.append(r.headers.get("location", ""))
                if 300 <= r.status < 400 else None)
        try:
            first = page.goto(f"http://{host}/hub/login")
            visit.first_url, visit.first_status, visit.first_headers = page.url, first.status, dict(first.headers)
            page.fill("#username_input", user)
            page.fill("#password_input", hub.password(user))
            page.click("#login_submit")
            page.wait_for_url("**/hub/spawn**", timeout=30_000)
            visit.spawn_form = page.inner_text("form")
            page.fill("input[name=workers]", str(workers))
            page.click("form [type=submit]")
            page.wait_for_url(f"{hub.user_url(user)}/lab**", timeout=300_000)
            put = requests.put(f"{hub.user_url(user)}/api/contents/tls.ipynb", timeout=30,
                               headers={"Authorization": f"token {hub.user_token(user)}"},
                               json={"type": "notebook", "content": notebook(["%load_ext pdl_magics",
                                                                              cell(workers)])})
            assert put.status_code == 201, put.text
            # ?reset: no restored workspace dialogs; wait for Idle before running (jupyterlab#15420)
            page.goto(f"{hub.user_url(user)}/lab/tree/tls.ipynb?reset")
            page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)
            page.click("#jp-menu-panel >> text=Run", timeout=10_000)
            page.click("text=Run All Cells", timeout=10_000)
            done = json.dumps(RANK_LINE.format(rank=0, world=workers))
            page.wait_for_function(
                f"() => {{ const t = document.querySelector('.jp-Notebook').innerText;"
                f" return t.includes({done}) || /Traceback|Error/.test(t); }}", timeout=300_000, polling=500)
            visit.notebook_text = page.locator(".jp-Notebook").inner_text()
            visit.cookies = context.cookies()
        except BaseException:
            page.screenshot(path=str(Path(failure_dir) / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    return visit


def check_https_all_the_way(visit: Visit, hub, workers: int, hsts: str | None = None) -> None:
    """What every way in must give the user: sent from http:// to the https login page
    (with ``hsts``, the header sent), the cell's rank 0 line and no traceback, every
    cookie Secure, no certificate or mixed-content error, every redirect on https."""
    assert (visit.first_url, visit.first_status) == (f"{hub.url}/hub/login", 200)
    if hsts is not None:
        assert visit.first_headers.get("strict-transport-security") == hsts, visit.first_headers
    text = visit.notebook_text
    assert RANK_LINE.format(rank=0, world=workers) in text and "Traceback" not in text, text[-3000:]
    assert visit.cookies and all(c["secure"] for c in visit.cookies), [
        (c["name"], c["domain"], c["secure"]) for c in visit.cookies]
    assert not visit.problems, visit.problems
    # every redirect stays on the https origins (relative, or https://)
    assert all(not r.startswith("http:") for r in visit.redirects), visit.redirects
