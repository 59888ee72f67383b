"""Spawn button to a cell's output, in a real browser: this tree vs the commit before
the warm engines, on the embedded default.

    .venv/bin/python bench/spawn_to_output.py [--rounds 3] [--peer 109cffc]

Each round runs both ways, one after the other (which goes first flips every round, so
load changes hit both alike). A way is a hub of the embedded default with two CPU
workers, started by the tests' harness of that way's tree (``tests/harness/hub_harness.py``),
and one user in headless Chromium (Debian's package, through Playwright) who logs in,
asks for 2 workers on the spawn page and runs ``%%distributed -n 2`` cells whose rank 0
prints both ranks' pids (a cell's output is rank 0's). Measured, in seconds, with the bench's own clock:

- **spawn → Lab**: from the spawn form's submit to JupyterLab's launcher on the page;
- **open notebook**: from a double-click on the notebook in the Lab's file browser to
  its kernel's "Idle";
- **first cell**: from Run All to the line of the first ``%%distributed -n 2`` cell
  (the engines were started at the spawn);
- **spawn → first output**: the three above together (not the bench's own steps
  between them: putting the notebook in the user's home, refreshing the file browser);
- **replaced**: rank 1's engine killed (SIGKILL), from running the next cell to its
  line with rank 1's new pid;
- **idle return**: once the hub has reclaimed the idle engines
  (``PDL_ENGINE_IDLE_TIMEOUT``), from running the next cell to its line.

The peer is ``git archive`` of ``--peer`` under ``.pdl/bench/``, run with its tree first
on ``PYTHONPATH`` for the hub, the user's server and the engines (``.venv``'s PDL is a
path file to this tree, which ``PYTHONPATH`` precedes) and with jupyter-lsp on, as that
commit's server configuration had it. Every rank tells the folder its ``pdl`` came
from, and a way whose engines ran the other tree's PDL fails. Prints each way's
medians and the ratios peer / this tree. Needs root (the harness's users get Unix
accounts) and Chromium, as the browser tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USER = "ann"
IDLE_S = 30  #: the hub's PDL_ENGINE_IDLE_TIMEOUT in both ways (s)
STEPS = ("spawn_to_lab", "open_notebook", "first_cell", "spawn_to_output", "replaced", "idle_return")
LABELS = {
    "spawn_to_lab": "spawn → Lab", "open_notebook": "open notebook", "first_cell": "first cell",
    "spawn_to_output": "spawn → first output", "replaced": "replaced", "idle_return": "idle return",
}


def cell(tag: str) -> str:
    """A ``%%distributed -n 2`` cell whose rank 0 (the one a cell's output shows) prints
    ``ranks PID0 PID1 in FOLDER0 FOLDER1: tag``, each rank's pid and its PDL's folder."""
    return ("%%distributed -n 2\nimport os, pdl\nimport torch.distributed as dist\n"
            "ranks = [None, None]\n"
            "dist.all_gather_object(ranks, (os.getpid(), os.path.dirname(os.path.dirname(pdl.__file__))))\n"
            "if dist.get_rank() == 0:\n"
            f"    print('ranks', *(r[0] for r in ranks), 'in', *(r[1] for r in ranks), end=': {tag}\\n', flush=True)")


TAGS = ("first", "after a kill", "after idle")


def notebook() -> dict:
    """The bench's notebook (nbformat 4): the magics loaded, then one cell per tag."""
    sources = ["%load_ext pdl_magics", *(cell(tag) for tag in TAGS)]
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": source} for i, source in enumerate(sources)]}


# -- one way, in a process of its own (the harness of that way's tree) ---------------


def one_way(tree: Path) -> dict:
    """Start a hub with the harness of ``tree``, drive one user through it in Chromium
    and return each step's seconds (:data:`STEPS`)."""
    sys.path.insert(0, str(tree / "tests" / "harness"))
    import host_names
    import requests
    from browser_harness import chromium_page
    from hub_harness import Hub, running

    host_names.install()  # the hub's name, hub.localhost, as the browser resolves it
    # not under /tmp: each user's server has a /tmp of its own (so do the tests, tests/conftest.py)
    runs = REPO / ".pdl" / "bench" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spawn-", dir=runs) as root:
        hub = Hub(Path(root), [USER], ["cpu:0", "cpu:1"], spawner_env=way_env(tree),
                  hub_env={"PDL_ENGINE_IDLE_TIMEOUT": str(IDLE_S)})
        with running(hub), chromium_page(Path(root)) as page:
            return drive(hub, page, tree, requests)


def drive(hub, page, tree: Path, requests) -> dict:
    seconds: dict[str, float] = {}
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", USER)
    page.fill("#password_input", hub.password(USER))
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**", timeout=30_000)
    page.fill("input[name=workers]", "2")

    started = time.monotonic()
    page.click("form [type=submit]")
    page.wait_for_url(f"{hub.user_url(USER)}/lab**", timeout=120_000)
    page.wait_for_selector(".jp-LauncherCard", timeout=60_000)
    seconds["spawn_to_lab"] = time.monotonic() - started

    put = requests.put(f"{hub.user_url(USER)}/api/contents/bench.ipynb", timeout=30,
                       headers={"Authorization": f"token {hub.user_token(USER)}"},
                       json={"type": "notebook", "content": notebook()})
    put.raise_for_status()
    # as the user would open it: in the Lab that is open, from its file browser (the
    # bench's upload and the browser's refresh are not the user's time)
    page.click('.jp-FileBrowser [data-command="filebrowser:refresh"]', timeout=10_000)
    item = page.locator(".jp-DirListing-item", has_text="bench.ipynb")
    item.wait_for(timeout=30_000)
    opened = time.monotonic()
    item.dblclick()
    # wait for Idle before running (jupyterlab#15420)
    page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)
    seconds["open_notebook"] = time.monotonic() - opened

    ran = time.monotonic()
    page.click("#jp-menu-panel >> text=Run", timeout=10_000)
    page.click("text=Run All Cells", timeout=10_000)
    wait_for_line(page, 1, hub)
    seconds["first_cell"] = time.monotonic() - ran
    seconds["spawn_to_output"] = seconds["spawn_to_lab"] + seconds["open_notebook"] + seconds["first_cell"]
    for index in range(2, len(TAGS) + 1):  # Run All ran every cell: let them all finish
        wait_for_line(page, index, hub)
    line = ranks_line(output(page, 1))
    for rank, folder in enumerate(line.group(3, 4)):
        if Path(folder).resolve() != tree.resolve():
            raise SystemExit(f"rank {rank} ran the PDL in {folder}, not {tree}")

    os.kill(int(line.group(2)), signal.SIGKILL)
    seconds["replaced"] = rerun(page, 2, hub)

    log_start = hub.log_path.stat().st_size
    deadline = time.monotonic() + IDLE_S + 60
    while "Reclaimed " not in hub.log_path.read_text(errors="replace")[log_start:]:
        if time.monotonic() > deadline:
            raise SystemExit(f"the hub did not reclaim the idle engines within {IDLE_S + 60} s")
        time.sleep(0.5)
    seconds["idle_return"] = rerun(page, 3, hub)
    return seconds


def output(page, index: int) -> str:
    """The text of the notebook's cell ``index``'s output area ("" before it has one)."""
    area = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")
    return area.inner_text() if area.count() else ""


def ranks_line(text: str) -> re.Match | None:
    """The line of a :func:`cell` in ``text``: rank 0's and rank 1's pids, then their PDL's folders."""
    return re.search(r"^ranks (\d+) (\d+) in (\S+) (\S+): ", text, re.M)


def rerun(page, index: int, hub) -> float:
    """Run the notebook's cell ``index`` again (Shift+Enter in it) and return the seconds
    to rank 1's line from a new engine (a pid other than its line's before: the killed
    engine's replacement, or the engines brought back after an idle reclaim)."""
    before = output(page, index)
    old = ranks_line(before)
    page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputArea-editor").click()
    started = time.monotonic()
    page.keyboard.press("Shift+Enter")
    wait_for_line(page, index, hub, unlike=old.group(2) if old else None, stale=before)
    return time.monotonic() - started


def wait_for_line(page, index: int, hub, unlike: str | None = None, stale: str | None = None) -> str:
    """Cell ``index``'s output once its ranks' line is in it (with rank 1's pid other than
    ``unlike``); SystemExit with the output if the cell fails (an output other than
    ``stale``, the one before the cell ran again, with a traceback) or 120 s pass."""
    deadline = time.monotonic() + 120
    while True:
        text = output(page, index)
        line = ranks_line(text)
        if line and line.group(2) != unlike:
            return text
        if text != stale and ("Traceback" in text or "Error" in text):
            raise SystemExit(f"cell {index} failed:\n{text[-2000:]}\n{hub.log_tail(20)}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no line of the ranks in cell {index} within 120 s:\n{text[-1500:]}")
        time.sleep(0.05)


def way_env(tree: Path) -> dict[str, str]:
    """The users' servers' environment for ``tree``: nothing for this one; the peer's
    tree on PYTHONPATH and its server configuration (jupyter-lsp on) for a peer."""
    if tree.resolve() == REPO:
        return {}
    config = tree / ".bench-jupyter-config" / "jupyter_server_config.d"
    config.mkdir(parents=True, exist_ok=True)
    (config / "peer.json").write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_lsp": True}}}))
    return {"PYTHONPATH": str(tree), "JUPYTER_CONFIG_PATH": str(tree / ".bench-jupyter-config")}


# -- the two ways side by side --------------------------------------------------------


def peer_tree(commit: str) -> Path:
    """``commit``'s files under ``.pdl/bench/peer-<commit>`` (``git archive``), made once,
    with this tree's ``.pdl/node`` (configurable-http-proxy)."""
    sha = subprocess.run(["git", "rev-parse", "--short", commit], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = REPO / ".pdl" / "bench" / f"peer-{sha}"
    if not (tree / "pdl").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    node = tree / ".pdl" / "node"  # the proxy scripts/setup installed, where the peer's hub looks for it
    if not node.exists():
        node.parent.mkdir(exist_ok=True)
        node.symlink_to(REPO / ".pdl" / "node")
    return tree


def run_way(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree) if tree != REPO else "",
                                                                      os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, "--one-way", str(tree)], capture_output=True, text=True,
                          env=env, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"the way of {tree} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each way once a round (default 3)")
    parser.add_argument("--peer", default="109cffc", help="the commit to compare with (default 109cffc, "
                        "the last before the warm engines)")
    parser.add_argument("--one-way", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_way:
        print("RESULT " + json.dumps(one_way(args.one_way)), flush=True)
        return
    if os.geteuid() != 0:
        raise SystemExit("bench/spawn_to_output.py: needs root (the hub gives its user a Unix account)")
    sys.path.insert(0, str(REPO / "bench"))
    from _common import machine

    ways = {"this tree": REPO, f"peer {args.peer}": peer_tree(args.peer)}
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    for round_ in range(args.rounds):
        order = list(ways) if round_ % 2 == 0 else list(ways)[::-1]
        for name in order:
            runs[name].append(run_way(ways[name]))
            print(f"round {round_ + 1}, {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[name][-1].items()),
                  flush=True)
    print(f"\n2 CPU workers, {args.rounds} rounds, medians (s); {machine()}")
    print("| way | " + " | ".join(LABELS[s] for s in STEPS) + " |")
    print("|---|" + "---:|" * len(STEPS))
    medians = {name: {s: statistics.median(r[s] for r in runs[name]) for s in STEPS} for name in ways}
    for name in ways:
        print(f"| {name} | " + " | ".join(f"{medians[name][s]:.2f}" for s in STEPS) + " |")
    this, peer = medians["this tree"], medians[f"peer {args.peer}"]
    print(f"\npeer / this tree: " + ", ".join(f"{LABELS[s]} {peer[s] / this[s]:.2f}x" for s in STEPS))


if __name__ == "__main__":
    main()
