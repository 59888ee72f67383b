"""The fair queue's bookkeeping (SQLite, no hub): order, leaving, stale waiters."""

from __future__ import annotations

import time

import pytest

from pdl_spawner.core.wait_queue import WaitQueue

pytestmark = pytest.mark.unit


def test_first_come_first_served_and_leaving_keeps_the_order(tmp_path):
    q = WaitQueue(tmp_path / "q.sqlite")
    assert q.join("alice", "alice", 2) == 1
    assert q.join("bob", "bob", 1) == 2
    assert q.join("carol/big", "carol", 3) == 3
    assert q.join("alice", "alice", 2) == 1  # joining again keeps one's place
    assert [w.owner for w in q.ahead_of("carol/big")] == ["alice", "bob"]
    assert q.leave("bob") and not q.leave("bob")
    assert q.position("carol/big") == 2 and q.position("bob") == 0
    assert [(w.user, w.wanted) for w in q.waiters()] == [("alice", 2), ("carol", 3)]
    assert [w.owner for w in WaitQueue(tmp_path / "q.sqlite").waiters()] == ["alice", "carol/big"]  # persisted


def test_a_waiter_that_stops_beating_is_dropped(tmp_path):
    q = WaitQueue(tmp_path / "q.sqlite", stale_after_s=0.5)
    q.join("alice", "alice", 1)
    q.join("bob", "bob", 1)
    for _ in range(3):
        time.sleep(0.3)
        q.beat("bob")
    assert [w.owner for w in q.waiters()] == ["bob"]
