"""Galata (Playwright) tests of the Cluster panel in a real JupyterLab and Chromium.

Runs ``labextension/ui-tests`` (``npx playwright test``) against a JupyterLab started
here, with two CPU-slot engines supervised as under the hub. The npm packages are
installed on first use (``npm ci``, ~600 MB); Chromium is Debian's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lab_harness import LabServer, SlotCluster

pytestmark = pytest.mark.browser

UI_TESTS = Path(__file__).resolve().parents[2] / "labextension" / "ui-tests"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SLOTS = ["cpu:0", "cpu:1"]


def _require(tool: str | None, what: str) -> None:
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail(f"no {what}")
        pytest.skip(f"no {what}")


@pytest.fixture(scope="module")
def galata_packages():
    _require(shutil.which("npm"), "npm on PATH")
    _require(CHROMIUM, "chromium on PATH (scripts/setup --test installs it as root)")
    if not (UI_TESTS / "node_modules" / "@jupyterlab" / "galata").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=UI_TESTS, check=True, timeout=900)
    return UI_TESTS


def _without_browser_logs(report: str) -> str:
    """Playwright's report less the browser's own log lines (``[pid=N][err] ...``), which it
    appends to an error when the page or browser closed and which would push the error out of view."""
    kept = [line for line in report.splitlines() if not line.lstrip().startswith("[pid=")]
    return "\n".join(kept)


def test_the_cluster_panel_in_jupyterlab(galata_packages, tmp_path, monkeypatch):
    import jupyterlab

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.delenv("PDL_CLUSTER_FILE", raising=False)
    cluster = SlotCluster(tmp_path / "cluster", SLOTS).start()
    galata_ext = Path(jupyterlab.__file__).parent / "galata"
    lab = LabServer(tmp_path / "lab", env=cluster.hub_env(), extra_args=[
        f"--LabServerApp.extra_labextensions_path={galata_ext}",
        "--LabApp.expose_app_in_browser=True",
    ])
    try:
        lab.start()
        env = dict(os.environ, PDL_LAB_URL=lab.url, PDL_LAB_TOKEN=lab.token, PDL_ENGINES=str(len(SLOTS)),
                   PDL_SCREENSHOTS=str(tmp_path), PDL_CHROMIUM=CHROMIUM,
                   PDL_TEST_OUTPUT=str(tmp_path / "playwright"))
        done = subprocess.run(["npx", "playwright", "test"], cwd=galata_packages, env=env,
                              capture_output=True, text=True, timeout=600)
        report = _without_browser_logs(done.stdout)
        print(report[-6000:])
        assert done.returncode == 0, f"{report[-6000:]}\n{done.stderr[-3000:]}\n--- lab log ---\n{lab.log_tail()}"
        assert (tmp_path / "panel-galata.png").exists()
    finally:
        lab.stop()
        cluster.stop()
