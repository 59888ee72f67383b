"""A real Prometheus (Debian's ``prometheus``, installed by ``scripts/setup --test``) on
127.0.0.1, scraping one target with a bearer token from a file, as a lab's Prometheus
scrapes its hub; read back through its own HTTP query API."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import requests

from hub_harness import free_port
from pdl.process import die_with_parent
from waiting import wait_until


def problem() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    if shutil.which("prometheus") is None:
        return "no prometheus on PATH (scripts/setup --test installs Debian's)"
    return None


class Prometheus:
    """A running Prometheus: :meth:`query` evaluates PromQL now."""

    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """(labels, value) of each series ``expr`` gives now (an instant query)."""
        r = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]

    def value(self, expr: str) -> float | None:
        """The value of ``expr``'s one series now; None when it gives none."""
        found = self.query(expr)
        assert len(found) <= 1, found
        return found[0][1] if found else None

    def targets_up(self) -> bool:
        r = requests.get(f"{self.url}/api/v1/targets", timeout=10)
        r.raise_for_status()
        active = r.json()["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def last_error(self) -> str:
        r = requests.get(f"{self.url}/api/v1/targets", timeout=10)
        return json.dumps([t.get("lastError") for t in r.json()["data"]["activeTargets"]])


@contextlib.contextmanager
def prometheus(folder: Path, target: str, metrics_path: str, token_file: Path,
               interval_s: float = 1.0) -> Iterator[Prometheus]:
    """Prometheus scraping ``http://<target><metrics_path>`` every ``interval_s`` seconds
    with the token in ``token_file`` (its ``credentials_file``), its data in ``folder``;
    stopped (and waited for) on the way out."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(f"""
global:
  scrape_interval: {round(interval_s * 1000)}ms
  evaluation_interval: {round(interval_s * 1000)}ms
scrape_configs:
  - job_name: pdl-hub
    metrics_path: {metrics_path}
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["{target}"]
""")
    log = open(folder / "prometheus.log", "w")
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"prometheus exited: {(folder / 'prometheus.log').read_text()[-2000:]}"
            try:
                return requests.get(f"{server.url}/-/ready", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(ready, 60, what="Prometheus to be ready")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
