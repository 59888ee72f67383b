"""The Cluster panel in a real browser, through the hub.

Log in through the hub's form (which says how long sessions last), spawn 3 workers,
open the Cluster panel and see the 3 engines idle, the time left, and "Extend" giving
one more hour and then saying the longest session is reached; run a
``%%distributed -n 3`` cell that calls ``pdl.log`` and watch every rank's progress
advance in the panel; press "Stop cell" and see every rank
stop and the engines idle again. Screenshots go to docs/img/ (panel.png, training.png).
"""

from __future__ import annotations

import re
import time

import pytest
import requests

from browser_harness import chromium_page
from hub_harness import REPO, Hub, hub_fixture, runs_as_root

pytestmark = pytest.mark.browser

SCREENSHOTS = REPO / "docs" / "img"
TOTAL = 3000
CELLS = [
    "%load_ext pdl_magics",
    "%%distributed -n 3\n"
    "import time, pdl\n"
    f"for i in range(1, {TOTAL + 1}):\n"
    f"    pdl.log(step=i, total={TOTAL}, loss=4.0 / i, img_per_s=250.0 + rank)\n"
    "    time.sleep(0.05)",
]
PANEL = "#pdl-cluster-panel"

#: What the machine enforces on each user, beside their workers: as root, the process
#: limit (a pids cgroup per account; no cpu_limit or mem_limit is set here).
MACHINE_LIMITS = " This machine's limits on you: 4,096 processes in all." if runs_as_root() else ""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # sessions of 1 h, which ada may extend once, to 2 h
    yield from hub_fixture(tmp_path_factory.mktemp("panel-hub"), ["ada"], ["cpu:0", "cpu:1", "cpu:2"],
                           hub_env={"PDL_SESSION_LIMIT_S": "3600", "PDL_SESSION_MAX_S": "7200"})


@pytest.fixture
def page(tmp_path):
    with chromium_page(tmp_path, height=900) as page:
        yield page


def write_notebook(hub: Hub, user: str, name: str) -> None:
    cells = [{"cell_type": "code", "source": src, "metadata": {}, "outputs": [], "execution_count": None}
             for src in CELLS]
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}}, "cells": cells}
    r = requests.put(f"{hub.user_url(user)}/api/contents/{name}", json={"type": "notebook", "content": nb},
                     headers={"Authorization": f"token {hub.user_token(user)}"}, timeout=30)
    r.raise_for_status()


def rank_steps(page) -> list[int]:
    return page.eval_on_selector_all(f"{PANEL} .pdl-rank", "els => els.map(e => Number(e.dataset.step || 0))")


def engine_states(page) -> list[str]:
    return page.eval_on_selector_all(f"{PANEL} .pdl-engine", "els => els.map(e => e.dataset.state)")


def wait_for(page, predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        page.wait_for_timeout(250)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; panel: "
                         f"{page.inner_text(PANEL)[:2000]}\nnotebook (end): "
                         f"{page.inner_text('.jp-Notebook')[-2000:]}")


def wait_cell_done(page, index: int) -> None:
    """Wait until code cell ``index`` has its execution count: the kernel answered it.

    Jupyter aborts a cell sent while the one before is still ending in an error
    (``stop_on_error``), so a cell stopped by an interrupt must finish before the next runs.
    """
    prompt = f".jp-Notebook .jp-CodeCell >> nth={index} >> .jp-InputPrompt"
    wait_for(page, lambda: page.inner_text(prompt).strip()[1:-2].isdigit(), 30, f"cell {index} to finish")


def test_the_cluster_panel_shows_engines_live_progress_and_stops_the_cell(hub, page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "ada")
    page.fill("#password_input", hub.password("ada"))
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**", timeout=30_000)
    assert page.inner_text("form .pdl-limits") == "You may hold 3 workers; you hold 0." + MACHINE_LIMITS
    assert page.inner_text("form .pdl-session").startswith("Sessions last at most 1 h 00 min: ")
    page.fill("input[name=workers]", "3")
    page.click("form [type=submit]")
    page.wait_for_url("**/user/ada/lab**", timeout=90_000)

    write_notebook(hub, "ada", "panel.ipynb")
    page.goto(f"{hub.user_url('ada')}/lab/tree/panel.ipynb?reset")
    page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)

    page.click(".lm-TabBar-tab[data-id='pdl-cluster-panel']")
    wait_for(page, lambda: engine_states(page) == ["idle"] * 3, 90, "3 idle engines in the panel")
    wait_for(page, lambda: all(t[4:-1].isdigit() for t in page.locator(f"{PANEL} .pdl-cpu").all_inner_texts()),
             10, "each engine's CPU%")
    assert "Reserved: 3 slots (cpu:0, cpu:1, cpu:2)" in page.inner_text(PANEL)
    assert page.inner_text(f"{PANEL} .pdl-limits") == "You may hold 3 workers; you hold 3." + MACHINE_LIMITS
    why = "(the hub's session limit of 1 h 00 min)"
    assert re.match(r"Time left: 5\d min " + re.escape(why), page.inner_text(f"{PANEL} .pdl-time-left"))
    page.click(f"{PANEL} button.pdl-extend")
    wait_for(page, lambda: re.match(r"Time left: 1 h 5\d min " + re.escape(why),
                                    page.inner_text(f"{PANEL} .pdl-time-left")),
             15, "the time left to grow by the hub's answer")
    assert page.inner_text(f"{PANEL} .pdl-extension").startswith("Extended: your session now ends at ")
    page.click(f"{PANEL} button.pdl-extend")
    wait_for(page, lambda: page.inner_text(f"{PANEL} .pdl-extension") ==
             "Not extended: the longest session here is 2 h 00 min, and yours has reached it", 15,
             "the hub's refusal of a second extension")
    assert page.is_disabled(f"{PANEL} button.pdl-stop")
    page.locator(PANEL).screenshot(path=str(SCREENSHOTS / "panel.png"))

    page.click("#jp-menu-panel >> text=Run", timeout=10_000)
    page.click("text=Run All Cells", timeout=10_000)
    first = wait_for(page, lambda: (s := rank_steps(page)) and len(s) == 3 and min(s) >= 5 and s, 120,
                     "all 3 ranks' progress in the panel")
    assert engine_states(page) == ["busy"] * 3
    later = wait_for(page, lambda: (s := rank_steps(page)) and all(b > a + 5 for a, b in zip(first, s)) and s,
                     30, "the progress to advance")
    text = page.inner_text(PANEL)
    assert f"step {later[0]}/{TOTAL}" in text or f"/{TOTAL}" in text
    assert "img/s" in text and "loss" in text
    page.screenshot(path=str(SCREENSHOTS / "training.png"))

    page.click(f"{PANEL} button.pdl-stop")
    page.wait_for_function(
        "() => /Interrupted: all 3 ranks stopped/.test(document.querySelector('.jp-Notebook').innerText)",
        timeout=60_000, polling=500,
    )
    wait_for(page, lambda: engine_states(page) == ["idle"] * 3, 30, "the engines idle after Stop")
    wait_for(page, lambda: page.get_attribute(f"{PANEL} .pdl-cell", "data-running") == "false", 30,
             "the panel to show the cell stopped")
    stopped = rank_steps(page)
    assert len(stopped) == 3 and all(0 < s < TOTAL for s in stopped), stopped
    wait_cell_done(page, 1)

    # Again, stopped this time from the notebook's toolbar (the kernel's interrupt button),
    # while the in-cell progress widget advances.
    page.click(".jp-Notebook .jp-CodeCell >> nth=1")
    page.keyboard.press("Shift+Enter")
    wait_for(page, lambda: page.get_attribute(f"{PANEL} .pdl-cell", "data-running") == "true", 60,
             "the cell to run again")
    widget_steps = []
    for _ in range(2):
        wait_for(page, lambda: (t := page.locator(".pdl-progress").all_inner_texts()) and "step " in t[0], 60,
                 "the progress widget")
        text = page.locator(".pdl-progress").inner_text()
        widget_steps.append(int(text.split("step ", 1)[1].split("/", 1)[0]))
        page.wait_for_timeout(2000)
    assert widget_steps[1] > widget_steps[0], widget_steps  # the widget advances live
    page.click(".jp-NotebookPanel-toolbar [data-jp-item-name='interrupt'] button, "
               ".jp-NotebookPanel-toolbar [data-command='notebook:interrupt-kernel']")
    page.wait_for_function(
        "() => /Interrupted: all 3 ranks stopped/.test(document.querySelector('.jp-Notebook').innerText)",
        timeout=60_000, polling=500,
    )
    wait_for(page, lambda: engine_states(page) == ["idle"] * 3, 30, "the engines idle after the interrupt")
    wait_for(page, lambda: page.get_attribute(f"{PANEL} .pdl-cell", "data-running") == "false", 30,
             "the panel to show the cell stopped")
    wait_cell_done(page, 1)
