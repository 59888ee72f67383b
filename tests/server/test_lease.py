"""The engine lease's messages (pdl/lease.py): one writer, one reader, and what the
reader refuses. Everything in a lease can be written by the user, so the reader is
the first line of the hub's distrust: a bad shape is refused in one line, never
turned into a message."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from pdl.contract import ServerContract
from pdl.lease import (Answer, ExtendAnswer, Extended, ExtendWish, GpuIdle, Grant, Holding, LeaseFiles,
                       LeaseFormatError, LeaseState, LeaseView, Refusal, Release, Want, decode, encode)

pytestmark = pytest.mark.unit

MESSAGES = [
    Release(reason="engines idle for 600 s", workers=2, slots=("gpu:0", "gpu:3")),
    Release(reason="engines idle for 5 s", workers=3),
    Want(workers=2),
    Grant(workers=2, slots=("gpu:1", "gpu:2")),
    Grant(workers=2, slots=("gpu:0", "gpu:1"), job=41),
    Grant(workers=4),
    Grant(workers=1, slots=("cpu:0",), ends_at=1_800_000_000.5),
    Refusal("Not enough free GPUs for you now: 1 free, you asked for 2."),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_what_the_writer_writes_the_reader_reads_back(message):
    kind = Answer if isinstance(message, (Grant, Refusal)) else type(message)
    assert decode(kind, json.loads(json.dumps(encode(message)))) == message


def test_a_wish_for_more_time_and_its_answers_round_trip():
    wish, yes, no = ExtendWish(asked_at=1_800_000_000.0), Extended(ends_at=1_800_003_600.0, of=1_800_000_100.0), \
        Refusal("Not extended: 1 other user is waiting for workers")
    assert encode(wish) == {"extend_asked_at": 1_800_000_000.0}
    assert encode(yes) == {"extended_to": 1_800_003_600.0, "of": 1_800_000_100.0}
    assert decode(ExtendWish, encode(wish)) == wish
    assert decode(ExtendAnswer, encode(yes)) == yes and decode(ExtendAnswer, encode(no)) == no
    view = LeaseView(extend=wish)
    assert LeaseView.from_json(json.loads(json.dumps(view.to_json()))) == view
    with pytest.raises(LeaseFormatError):
        decode(ExtendAnswer, {"extended_to": "later"})


def test_the_wire_shapes_are_exactly_these():
    """Golden values: the hub and every user's server speak this; a change is a change of both."""
    assert encode(MESSAGES[0]) == {"reason": "engines idle for 600 s", "workers": 2, "slots": ["gpu:0", "gpu:3"]}
    assert encode(MESSAGES[4]) == {"workers": 2, "slots": ["gpu:0", "gpu:1"], "job": 41, "ends_at": 0.0}
    assert encode(MESSAGES[7]) == {"refused": "Not enough free GPUs for you now: 1 free, you asked for 2."}
    assert encode(Want(workers=3)) == {"workers": 3}


@pytest.mark.parametrize(("kind", "data", "words"), [
    (Release, {"reason": "idle", "workers": 0, "slots": []}, "workers must be a whole number >= 1, got 0"),
    (Release, {"reason": "idle", "workers": True}, "workers must be a whole number >= 1, got True"),
    (Release, {"reason": ["x"], "workers": 1}, "reason must be text"),
    (Release, {"reason": "idle", "workers": 1, "slots": ["tpu:0"]}, "tpu:0"),
    (Release, {"reason": "idle", "workers": 1, "slots": "gpu:0"}, "slots must be a list of slots"),
    (Answer, {"workers": 2, "slots": ["gpu:0"]}, "a grant of 2 worker(s) names 1 slot(s)"),
    (Answer, {"workers": "2"}, "workers must be a whole number >= 1, got '2'"),
    (Answer, {"workers": 1, "job": -4}, "job must be a whole number >= 0, got -4"),
    (Answer, {"refused": None}, "refused must be text"),
    (Answer, {"workers": 1, "ends_at": "soon"}, "ends_at must be a time in epoch seconds >= 0, got 'soon'"),
    (Answer, {"workers": 1, "ends_at": -1}, "ends_at must be a time in epoch seconds >= 0, got -1"),
    (Want, ["workers", 2], "a lease message must be a JSON object, got list"),
])
def test_a_malformed_message_is_refused_in_one_line(kind, data, words):
    with pytest.raises(LeaseFormatError) as e:
        decode(kind, data)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_wants_count_is_kept_as_written_for_the_hub_to_check():
    """The hub checks a request's count against the same limit as a spawn's, and its
    refusal quotes what was asked; the reader does not judge it first."""
    assert decode(Want, {"workers": "2"}) == Want(workers="2")
    assert decode(Want, {}) == Want(workers=None)


def test_the_views_json_round_trips_and_refuses_a_non_object():
    view = LeaseView(released=MESSAGES[0], want=Want(2), answer=Refusal("no"))
    assert LeaseView.from_json(json.loads(json.dumps(view.to_json()))) == view
    assert LeaseView.from_json({"released": None, "want": None, "grant": None}) == LeaseView()
    with pytest.raises(LeaseFormatError):
        LeaseView.from_json("released")


def test_the_files_hold_each_message_privately_and_forget_them_in_steps(tmp_path):
    files = LeaseFiles(tmp_path)
    assert files.view() == LeaseView()
    files.write(MESSAGES[0])
    files.write(Want(2))
    files.write(MESSAGES[3])
    assert files.view() == LeaseView(released=MESSAGES[0], want=Want(2), answer=MESSAGES[3])
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in tmp_path.iterdir()} == {0o600}

    files.release_answered()  # the hub started the engines itself: the answer stays for the server
    assert files.view() == LeaseView(answer=MESSAGES[3])
    files.keep_held(MESSAGES[3])
    files.end_release()
    assert files.view() == LeaseView(held=MESSAGES[3]) and files.view().state is LeaseState.HELD
    spawn = ServerContract(slots=("gpu:0",), workers=1)
    assert files.holding(spawn) == Holding(workers=2, slots=("gpu:1", "gpu:2"), grant=MESSAGES[3])
    files.write(MESSAGES[0])
    assert files.holding(spawn).released == MESSAGES[0] and files.holding(spawn).workers == 2  # asked for again
    files.clear()
    assert files.held() is None and files.holding(spawn) == Holding(workers=1, slots=("gpu:0",))


def test_a_file_that_is_not_a_message_reads_as_none(tmp_path):
    """What the user wrote by hand is no message: the server's API shows none."""
    (tmp_path / "engines-released.json").write_text('{"reason": "idle"}')
    (tmp_path / "engines-wanted.json").write_text("not json")
    assert LeaseFiles(tmp_path).view() == LeaseView()


def test_the_hubs_flag_on_gpus_held_idle_round_trips_and_reads_in_one_line(tmp_path):
    flag = GpuIdle(since=1_800_000_000.0, release_at=1_800_001_800.0)
    assert decode(GpuIdle, encode(flag)) == flag
    assert flag.line(now=1_800_002_100.0) == (
        f"GPUs held idle: 0 % use since {time.strftime('%H:%M UTC', time.gmtime(flag.since))} (35 min); "
        f"released at {time.strftime('%H:%M UTC', time.gmtime(flag.release_at))} unless used.")
    files = LeaseFiles(tmp_path)
    files.note_gpu_idle(flag)
    assert files.gpu_idle() == flag
    files.note_gpu_idle(GpuIdle(since=0.0))  # lifted
    assert files.gpu_idle() is None
