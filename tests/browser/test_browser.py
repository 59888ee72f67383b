"""A new user's path in a real browser (Chromium through Playwright).

Log in through the hub's form, ask for 3 workers on the spawn page, open the
CINIC-10 notebook in JupyterLab, run every cell, and read the trained model's
accuracy off the page.
"""

from __future__ import annotations

import re
import shutil
import time

import pytest

from browser_harness import chromium_page
from hub_harness import REPO, hub_fixture

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-hub")
    env = {"CINIC10_DIR": str(root / "no-cinic10-here"), "CINIC10_EPOCHS": "6"}  # else the recipe's choices
    notebooks = root / "home" / "ada" / "notebooks"
    notebooks.mkdir(parents=True)
    shutil.copy(REPO / "notebooks" / "cinic10_distributed.ipynb", notebooks)
    yield from hub_fixture(root, ["ada"], ["cpu:0", "cpu:1", "cpu:2"], spawner_env=env)


@pytest.fixture
def page(tmp_path):
    with chromium_page(tmp_path) as page:
        yield page


def test_new_user_logs_in_spawns_and_trains_in_the_browser(hub, page):
    started = time.monotonic()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "ada")
    page.fill("#password_input", hub.password("ada"))
    page.click("#login_submit")

    page.wait_for_url("**/hub/spawn**", timeout=30_000)
    assert "3 of 3 CPU workers free" in page.inner_text("form")
    page.fill("input[name=workers]", "3")
    page.click("form [type=submit]")
    page.wait_for_url("**/user/ada/lab**", timeout=90_000)
    assert sorted(hub.reservations().values()) == ["ada"] * 3

    # ?reset: no restored workspace dialogs; wait for Idle before running (jupyterlab#15420)
    page.goto(f"{hub.user_url('ada')}/lab/tree/notebooks/cinic10_distributed.ipynb?reset")
    page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)
    page.click("#jp-menu-panel >> text=Run", timeout=10_000)
    page.click("text=Run All Cells", timeout=10_000)

    # rank 0's progress widget (fed by pdl.log in the trainer) advances while it trains
    seen = []
    while len(set(seen)) < 3 and time.monotonic() - started < 400:
        texts = page.locator(".pdl-progress").all_inner_texts()
        if texts and "step " in texts[0]:
            seen.append(int(texts[0].split("step ", 1)[1].split("/", 1)[0]))
        page.wait_for_timeout(500)
    assert len(set(seen)) >= 3 and seen == sorted(seen), f"the progress widget did not advance: {seen}"

    notebook = page.locator(".jp-Notebook")
    page.wait_for_function(
        "() => /test accuracy: [0-9.]+%|Traceback/.test(document.querySelector('.jp-Notebook').innerText)",
        timeout=400_000,
        polling=1000,
    )
    text = notebook.inner_text()
    assert "Traceback" not in text, text[-3000:]
    assert "3 ranks on cpu" in text
    assert re.search(r"epoch 6/6 +train loss [\d.]+ +test acc", text), text[-2000:]
    accuracy = float(re.search(r"test accuracy: ([\d.]+)%", text).group(1))
    assert accuracy > 25.0, f"the model did not learn: {accuracy}% (chance is 10%)\n{text[-2000:]}"
    print(f"login to trained model in {time.monotonic() - started:.0f} s, accuracy {accuracy}%")
