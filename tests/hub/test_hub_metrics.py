"""PDL's series on JupyterHub's /hub/metrics, scraped by a real Prometheus (Debian's) with
the token of ``PDL_PROMETHEUS_TOKEN_FILE``, read back through Prometheus' own query API
after a refusal, a spawn, a cell on 2 workers and a stop (pdl_spawner/hub/metrics.py);
and the same hours in the hub's usage book, as ``pdl-usage`` prints them
(pdl_spawner/hub/usage_book.py, pdl_spawner/admin/usage_report.py) and the admin view shows them."""

from __future__ import annotations

import os
import secrets
import time

import pytest
import requests

import prometheus_server
from hub_harness import Hub, Kernel, admin_status, printed_usage, running, usage_seconds
from waiting import wait_until

pytestmark = pytest.mark.hub

POOL = ["cpu:0", "cpu:1"]
USERS = ["admin", "ann"]
#: Seconds between the hub's readings of who holds what (c.PDLMetrics.sample_s) and
#: between Prometheus' scrapes.
EVERY_S = 1.0
ANNS = 'pdl_workers_held{user="ann",worker="cpu"}'


@pytest.fixture
def prometheus_and_hub(tmp_path):
    if prometheus_server.problem():
        if os.environ.get("CI"):
            pytest.fail(prometheus_server.problem())
        pytest.skip(prometheus_server.problem())
    token = secrets.token_hex(32)
    token_file = tmp_path / "prometheus-token"
    token_file.touch(mode=0o600)
    token_file.write_text(token)
    hub = Hub(tmp_path / "hub", USERS, POOL, hub_env={"PDL_PROMETHEUS_TOKEN_FILE": str(token_file)},
              extra_config=f"c.PDLMetrics.sample_s = {EVERY_S}")
    with running(hub), prometheus_server.prometheus(tmp_path / "prometheus", f"127.0.0.1:{hub.port}", "/hub/metrics",
                                                    token_file, interval_s=EVERY_S) as prometheus:
        wait_until(prometheus.targets_up, 60, what=lambda: f"Prometheus to scrape the hub: {prometheus.last_error()}")
        yield prometheus, hub, token


def test_prometheus_reads_who_held_which_workers_for_how_long(prometheus_and_hub):
    prometheus, hub, token = prometheus_and_hub
    # the token reads the metrics and nothing else; without one, no metrics
    assert requests.get(f"http://127.0.0.1:{hub.port}/hub/metrics", timeout=30).status_code == 403
    assert hub.api("GET", "/users", token=token).status_code == 403
    assert prometheus.value("jupyterhub_running_servers") == 0  # JupyterHub's own series, beside PDL's

    assert hub.spawn("ann", 3).status_code in (400, 409)  # more than the pool: refused
    wait_until(lambda: (prometheus.value("sum(pdl_spawn_refusals_total)") or 0) >= 1, 30,
               what="the refusal to be counted")

    spawned = time.monotonic()
    assert hub.spawn("ann", 2).status_code in (201, 202)
    hub.wait_ready("ann")
    wait_until(lambda: prometheus.value(ANNS) == 2, 30, what="ann's 2 workers to show")
    seen = time.monotonic()
    kernel = Kernel(hub, "ann")
    try:
        kernel.execute_ok("%load_ext pdl_magics")
        out = kernel.execute_ok("%%distributed -n 2\nimport torch.distributed as dist\nprint(dist.get_world_size())")
        assert out["stdout"].strip() == "2", out
    finally:
        kernel.close()
    time.sleep(3 * EVERY_S)
    stopping = time.monotonic()
    hub.api("DELETE", "/users/ann/server")
    wait_until(lambda: prometheus.value(ANNS) == 0, 60, what="ann's workers to show as given back")
    gone = time.monotonic()

    held = prometheus.value('pdl_worker_seconds_total{user="ann",worker="cpu"}')
    # both workers, counted from before Prometheus saw them (less under a second: the status
    # has whole seconds) until the stop, whose reading comes before the workers are given
    # back however late the periodic one runs on a busy machine; never beyond the spawn's life
    assert 2 * (stopping - seen - 1.0) <= held <= 2 * (gone - spawned), (held, stopping - seen, gone - spawned)
    assert prometheus.value('pdl_queue_length') == 0

    # the hub's usage book has the same seconds, as the admin's pdl-usage prints them
    rows = printed_usage(hub)
    booked = usage_seconds(rows, "ann", "cpu")
    assert booked == pytest.approx(held, abs=1.0), (rows, held)
    # and the admin view shows them, this week's and this month's (one of them holds all
    # of them even where the test ran across a Monday's or a 1st's midnight, UTC)
    [anns] = [r for r in admin_status(hub)["usage"] if r["user"] == "ann"]
    assert max(anns["cpu_week_h"], anns["cpu_month_h"]) * 3600 == pytest.approx(held, abs=1.0), anns
    assert anns["gpu_week_h"] == anns["gpu_month_h"] == 0, anns
