"""The end of a server's session (pdl_server/session_clock.py): the time left, the
warning before the end, and the release a few seconds before it."""

from __future__ import annotations

import time

import pytest

from pdl.limits import duration
from pdl_server.session_clock import END_MARGIN_S, SessionEnd, session_end

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


@pytest.mark.parametrize("seconds,text", [(40.9, "40 s"), (60, "1 min"), (599, "9 min"), (3600, "1 h 00 min"),
                                          (3900, "1 h 05 min"), (90061, "25 h 01 min")])
def test_a_time_left_reads_in_hours_and_minutes_rounded_down(seconds, text):
    assert duration(seconds) == text


def test_the_user_is_warned_in_the_last_minutes_and_the_engines_released_in_the_last_seconds():
    end = SessionEnd(ends_at=NOW + 3600, why="Slurm job 42's time limit", warn_before_s=600)
    assert end.left_s(NOW) == 3600 and end.warning(NOW) is None and not end.ending(NOW)
    assert end.warning(NOW + 3600 - 480) == ("Your session ends in 8 min (Slurm job 42's time limit): "
                                             "save your work, or extend it.")
    assert not end.ending(NOW + 3600 - END_MARGIN_S - 1)
    assert end.ending(NOW + 3600 - END_MARGIN_S) and end.ending(NOW + 4000)
    assert end.left_s(NOW + 4000) == 0 and end.warning(NOW + 4000) is None  # ended: the release says so
    assert end.ended_reason() == "Slurm job 42's time limit reached at " + time.strftime(
        "%H:%M UTC", time.gmtime(NOW + 3600))


def test_under_a_hubs_limit_the_end_is_the_spawns_then_each_grants(tmp_path):
    from pdl.contract import ServerContract
    from pdl.lease import Grant, LeaseFiles

    contract = ServerContract(session_limit_s=3600, session_ends_at=NOW, session_warn_s=300)
    lease = LeaseFiles(tmp_path)
    assert session_end(contract, lease) == SessionEnd(ends_at=NOW, why="the hub's session limit of 1 h 00 min",
                                                      warn_before_s=300)
    lease.keep_held(Grant(workers=1, slots=("cpu:0",), ends_at=NOW + 4000))
    assert session_end(contract, lease).ends_at == NOW + 4000
    assert session_end(ServerContract(kind="local"), lease) is None  # no limit, no scheduler's: no end


def test_the_hubs_extension_moves_the_end_of_its_own_session_only(tmp_path):
    from pdl.contract import ServerContract
    from pdl.lease import Extended, Grant, LeaseFiles

    contract = ServerContract(session_limit_s=3600, session_ends_at=NOW)
    lease = LeaseFiles(tmp_path)
    lease.wish_extension(NOW - 60)
    assert lease.extend_wish() is not None and session_end(contract, lease).ends_at == NOW  # asked, not given
    lease.answer_extension(Extended(ends_at=NOW + 3600, of=NOW))
    assert lease.extend_wish() is None and session_end(contract, lease).ends_at == NOW + 3600
    lease.keep_held(Grant(workers=1, slots=("cpu:0",), ends_at=NOW + 9000))  # a later grant: a new session
    assert session_end(contract, lease).ends_at == NOW + 9000
