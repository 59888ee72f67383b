"""The hub's session limit (pdl_spawner/core/session_limit.py) and its uses in the
spawner core: a grant starts a session and tells its end, a release at the end is
logged in the hub's words, and a server that keeps its workers past the end has them
taken back. The user's server is a double of its lease API (the one seam); the slot
ledger and the spawner are real."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest

from lease_double import fake_user, lease_spawner
from pdl.lease import Grant
from pdl_spawner.core.reservations import SlotLedger
from pdl_spawner.core.session_limit import ENFORCE_AFTER_S

pytestmark = pytest.mark.unit

HOLDING = {"released": None, "want": None, "grant": None}  # the server says nothing: it keeps its engines


def test_a_grant_again_starts_a_new_session_and_tells_the_server_its_end(tmp_path):
    spawner = lease_spawner(tmp_path, {"released": {"reason": "engines idle for 9 s", "workers": 2, "slots": []},
                                       "want": {"workers": 2}, "grant": None}, session_limit_s=3600)
    before = time.time()
    asyncio.run(spawner.tend_lease())
    [grant] = spawner.fetch_lease.answers
    assert isinstance(grant, Grant) and grant.slots == ("cpu:0", "cpu:1")
    assert before + 3600 <= grant.ends_at <= time.time() + 3600 and spawner.session_ends_at == grant.ends_at
    state = spawner.get_state()
    assert state["pdl"]["session_ends_at"] == grant.ends_at  # the core's, under its own key
    restarted = lease_spawner(tmp_path, HOLDING, session_limit_s=3600)
    restarted.load_state(state)  # a hub restart
    assert restarted.session_ends_at == grant.ends_at and restarted.get_state() == state


def test_the_cores_saved_state_does_not_clash_with_the_spawner_librarys(tmp_path):
    """The core's state is one key of the spawner's, "pdl": a spawner library (or kind)
    that saves a field of the same name as one of the core's keeps it, and neither
    reads the other's."""
    from pdl_spawner.local.spawner import PDLLocalSpawner

    class LibrarySpawner(PDLLocalSpawner):  # a library's own field named like the core's
        def get_state(self):
            return {**super().get_state(), "session_ends_at": "the library's"}

    spawner = LibrarySpawner(user=fake_user("alice"), system_users=False, reservations_db=str(tmp_path / "r.sqlite"),
                             pool=["cpu:0"], session_limit_s=60)
    spawner.start_session()
    ends = spawner.session_ends_at
    state = spawner.get_state()
    assert state["session_ends_at"] == "the library's" and state["pdl"]["session_ends_at"] == ends
    loaded = LibrarySpawner(user=fake_user("alice"), system_users=False, reservations_db=str(tmp_path / "r.sqlite"),
                            pool=["cpu:0"], session_limit_s=60)
    loaded.load_state({"session_ends_at": "the library's", "pdl": "not a dict"})  # the core reads only its own key
    assert loaded.session_ends_at == 0.0
    loaded.load_state(state)
    assert loaded.session_ends_at == ends
    loaded.load_state({"session_ends_at": ends, "session_granted_end": ends})  # saved before the "pdl" key
    assert loaded.session_ends_at == ends


def test_a_server_that_keeps_its_workers_past_the_end_has_them_taken_back(tmp_path):
    """The attack: a user's server that never releases at its session's end (its
    supervisor stopped, or the lease files left alone). The hub frees the slots itself."""
    spawner = lease_spawner(tmp_path, HOLDING, session_limit_s=60)
    spawner.slots = SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    spawner.start_session(now=time.time() - 60 - ENFORCE_AFTER_S + 1)
    asyncio.run(spawner.tend_lease())
    assert SlotLedger(spawner.reservations_db).held_by("alice")  # not yet: the server has its few seconds

    spawner.start_session(now=time.time() - 60 - ENFORCE_AFTER_S)
    asyncio.run(spawner.tend_lease())
    assert SlotLedger(spawner.reservations_db).held_by("alice") == []
    [reclaim] = SlotLedger(spawner.reservations_db).reclaims()
    assert reclaim.reason == "the hub's session limit of 1 min reached" and reclaim.slots == ["cpu:0", "cpu:1"]
    assert spawner.session_ends_at == 0 and spawner.fetch_lease.answers == []


def test_a_release_that_leaves_a_gpu_open_is_taken_back_at_the_end_and_the_holder_killed(tmp_path):
    """The attack: the lease says released, but a process of the user keeps a GPU open,
    which an idle release would wait for. At the session's end the hub does not wait."""
    released = {"released": {"reason": "idle", "workers": 2, "slots": ["cpu:0", "cpu:1"]}, "want": None, "grant": None}
    spawner = lease_spawner(tmp_path, released, session_limit_s=60)
    SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    holder = subprocess.Popen(["sleep", "300"])
    try:
        spawner.gpu_holders = lambda slots: {holder.pid: ["/dev/nvidia0"]}  # the seam: what holds a GPU
        spawner.start_session(now=time.time() - 30)
        asyncio.run(spawner.tend_lease())  # before the end: kept while in use, as an idle release is
        assert SlotLedger(spawner.reservations_db).held_by("alice") and holder.poll() is None

        spawner.start_session(now=time.time() - 60 - ENFORCE_AFTER_S)
        asyncio.run(spawner.tend_lease())
        assert SlotLedger(spawner.reservations_db).held_by("alice") == []
        assert holder.wait(timeout=10) == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait()


def test_a_server_that_does_not_answer_past_the_end_has_its_workers_taken_back(tmp_path):
    spawner = lease_spawner(tmp_path, None, session_limit_s=60)
    SlotLedger(spawner.reservations_db).reserve("alice", 1, spawner.pool)
    spawner.start_session(now=time.time() - 60 - ENFORCE_AFTER_S)
    asyncio.run(spawner.tend_lease())
    assert SlotLedger(spawner.reservations_db).held_by("alice") == []


def test_a_release_at_the_end_is_logged_as_the_sessions_end_and_a_release_before_as_idleness(tmp_path):
    released = {"released": {"reason": "whatever the user wrote", "workers": 1, "slots": ["cpu:0"]},
                "want": None, "grant": None}
    for started_s_ago, reason in ((60 - 5, "the hub's session limit of 1 min reached"), (10, "engines idle for 9 s")):
        spawner = lease_spawner(tmp_path / str(started_s_ago), released, session_limit_s=60)
        SlotLedger(spawner.reservations_db).reserve("alice", 1, spawner.pool)
        spawner.start_session(now=time.time() - started_s_ago)
        asyncio.run(spawner.tend_lease())
        [reclaim] = SlotLedger(spawner.reservations_db).reclaims()
        assert reclaim.reason == reason
        assert spawner.session_ends_at == 0  # no workers held: no session runs


def test_without_a_limit_nothing_ends_and_the_form_says_nothing_of_it(tmp_path):
    spawner = lease_spawner(tmp_path, HOLDING)
    spawner.start_session()
    assert spawner.session_ends_at == 0 and not spawner.session_over(time.time() + 10**9)
    assert spawner.session_form_line() == "" and "pdl" not in spawner.get_state()
    assert "PDL_SESSION_LIMIT_S" not in spawner.server_contract().env()


def test_the_spawn_form_and_the_servers_contract_tell_the_limit(tmp_path):
    spawner = lease_spawner(tmp_path, HOLDING, session_limit_s=8 * 3600)
    html = asyncio.run(spawner.render_options_form())
    assert ('<p class="help-block pdl-session">Sessions last at most 8 h 00 min: your engines are then released, '
            'your notebook keeps its state, and the next cell asks for workers again.</p>') in html
    spawner.start_session(now=1_800_000_000.0)
    env = spawner.server_contract().env()
    assert env["PDL_SESSION_LIMIT_S"] == "28800" and env["PDL_SESSION_ENDS_AT"] == "1800028800.000"



WISH = {"released": None, "want": None, "grant": None, "extend": {"extend_asked_at": 1.0}}


def test_extend_adds_a_session_limit_up_to_the_longest_session_and_no_further(tmp_path):
    from pdl.lease import Extended, Refusal

    spawner = lease_spawner(tmp_path, WISH, session_limit_s=3600, session_max_s=3 * 3600)
    start = time.time()
    spawner.start_session(now=start)
    for _ in range(3):
        asyncio.run(spawner.tend_lease())
    assert spawner.fetch_lease.extensions == [
        Extended(ends_at=start + 2 * 3600, of=start + 3600), Extended(ends_at=start + 3 * 3600, of=start + 3600),
        Refusal("Not extended: the longest session here is 3 h 00 min, and yours has reached it")]
    assert spawner.session_ends_at == start + 3 * 3600  # what the hub enforces
    assert spawner.server_contract().env()["PDL_SESSION_EXTENDABLE"] == "1"


def test_extend_is_refused_while_others_wait_and_where_the_admin_allows_none(tmp_path):
    from pdl.lease import Refusal
    from pdl_spawner.core.wait_queue import WaitQueue

    spawner = lease_spawner(tmp_path / "queue", WISH, session_limit_s=3600, session_max_s=7200, queue_timeout=60)
    spawner.start_session()
    WaitQueue(spawner.reservations_db).join("bob", "bob", 1)
    asyncio.run(spawner.tend_lease())
    assert spawner.fetch_lease.extensions == [Refusal("Not extended: 1 other user is waiting for workers")]

    spawner = lease_spawner(tmp_path / "none", WISH, session_limit_s=3600)
    spawner.start_session()
    asyncio.run(spawner.tend_lease())
    assert spawner.fetch_lease.extensions == [Refusal("Not extended: sessions here last 1 h 00 min and are "
                                                      "not extended")]
    assert "PDL_SESSION_EXTENDABLE" not in spawner.server_contract().env()  # the panel offers no Extend
