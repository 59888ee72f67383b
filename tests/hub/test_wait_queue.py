"""The fair queue's bookkeeping (SQLite, no hub): order, leaving, stale waiters."""

from __future__ import annotations

import sqlite3
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


def test_waiters_for_different_gpu_types_neither_hold_up_nor_overtake_each_other(tmp_path):
    q = WaitQueue(tmp_path / "q.sqlite")
    q.join("ann", "ann", 1, "T4")
    q.join("bob", "bob", 2, "A100")
    q.join("cat", "cat", 1)            # any type: behind everyone before her
    q.join("dan", "dan", 1, "T4")
    assert [(w.owner, w.gpu_type) for w in q.waiters()] == [("ann", "T4"), ("bob", "A100"), ("cat", ""), ("dan", "T4")]
    assert q.position("ann") == 1 and q.position("bob") == 1  # each at the head of their type's line
    assert q.position("cat") == 3 and q.position("dan") == 3   # dan waits behind ann and cat
    assert [w.owner for w in q.ahead_of(None, "A100")] == ["bob", "cat"]  # a new A100 spawn waits for them
    assert [w.owner for w in q.ahead_of(None, "")] == ["ann", "bob", "cat", "dan"]


def test_a_queue_file_from_before_gpu_types_gets_the_column(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE queue (owner TEXT PRIMARY KEY, user TEXT NOT NULL, wanted INTEGER NOT NULL, "
               "since REAL NOT NULL, beat REAL NOT NULL)")
    db.execute("INSERT INTO queue VALUES ('ann', 'ann', 2, ?, ?)", (time.time(), time.time()))
    db.commit()
    db.close()
    q = WaitQueue(path)
    assert q.waiters()[0].gpu_type == "" and q.join("bob", "bob", 1, "T4") == 2  # behind ann, who takes any
    assert [(w.owner, w.gpu_type) for w in q.waiters()] == [("ann", ""), ("bob", "T4")]
