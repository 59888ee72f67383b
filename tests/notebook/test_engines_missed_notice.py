"""A client that missed the controller's notice of an engine (pdl_magics/engines.py,
``Engines._wait_for_registrations``): ipyparallel's client learns of engines only from
those notices, and one sent just after it connected can be lost. The cell must still
run, on a client that asked the controller again, instead of waiting in vain and
failing with "1 engines not ready in 60 seconds" (seen in a run on the simulated swarm).
And a notice the client handled while ipyparallel's wait was getting ready to listen
(counted, but never waking the wait) must not make the cell wait out the timeout.

Each fault is injected at one seam: the first client the session connects drops every
registration notice, or ipyparallel's wait is held at one step until the client knows
the engine; the controller, the engines and every later client are real."""

from __future__ import annotations

import io
import sys
import time

import ipyparallel as ipp
import pytest

from pdl_magics import DistributedSession
from pdl_server import clusters
from waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def local_session_env(tmp_path, monkeypatch):
    """A kernel's local session, outside any hub, its files under ``tmp_path``."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.delenv("PDL_CLUSTER_FILE", raising=False)
    monkeypatch.delenv("PDL_SLOTS", raising=False)
    monkeypatch.setenv("PDL_STATUS_DIR", str(tmp_path / "status"))


@pytest.fixture
def deaf_first_client(monkeypatch):
    """The first client connected drops the controller's registration notices."""
    connect = ipp.Cluster.connect_client
    made = []

    async def connect_once_deaf(cluster, *args, **kwargs):
        client = await connect(cluster, *args, **kwargs)
        if not made:
            client._notification_handlers["registration_notification"] = lambda msg: None
        made.append(client)
        return client

    monkeypatch.setattr(ipp.Cluster, "connect_client", connect_once_deaf)
    return made


def test_a_cell_runs_although_its_client_missed_the_engines_registration(monkeypatch, local_session_env,
                                                                         deaf_first_client):
    monkeypatch.setattr(clusters, "ENGINE_TIMEOUT_S", 30)  # the failure, were the notice awaited, in 30 s
    session = DistributedSession(local_slots=["cpu:0"])
    out, err = io.StringIO(), io.StringIO()
    try:
        session.run("import torch.distributed as dist\nprint('rank', dist.get_rank())", 1, out=out, err=err)
    finally:
        session.close()
    assert "rank 0" in out.getvalue(), (out.getvalue(), err.getvalue())
    assert len(deaf_first_client) == 2  # the deaf client was replaced by one that asked the controller


@pytest.fixture
def notice_before_listening(monkeypatch):
    """ipyparallel's wait for engines, after it counted the client's engines and before it
    listens for notices (where it asks ``get_ipython`` whether to show a progress bar),
    waits until the client's own thread has handled the engine's registration: the race
    of two runs on the simulated swarm, made certain. The list records each such wait."""
    from ipyparallel.client import client as client_module

    real = client_module.get_ipython
    held = []

    def get_ipython():
        caller = sys._getframe(1)
        if caller.f_code.co_name == "wait_for_engines":
            client, n = caller.f_locals["self"], caller.f_locals["n"]
            wait_until(lambda: len(client.ids) >= n, 60, what="the engine's registration")
            held.append(n)
        return real()

    monkeypatch.setattr(client_module, "get_ipython", get_ipython)
    return held


def test_a_cell_runs_at_once_on_an_engine_registered_while_the_wait_began_to_listen(
        monkeypatch, local_session_env, notice_before_listening):
    monkeypatch.setattr(clusters, "ENGINE_TIMEOUT_S", 120)  # were the notice awaited: 120 s, then the cell
    session = DistributedSession(local_slots=["cpu:0"])
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    try:
        session.run("import torch.distributed as dist\nprint('rank', dist.get_rank())", 1, out=out, err=err)
    finally:
        session.close()
    assert notice_before_listening == [1], "the registration came before the wait: the race was not made"
    assert "rank 0" in out.getvalue(), (out.getvalue(), err.getvalue())
    assert time.monotonic() - started < 60, "the cell waited out ipyparallel's wait for a notice that never came"
