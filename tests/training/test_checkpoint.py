"""Checkpoint and resume: pdl.checkpoint's atomic, weights_only file, and fit(checkpoint=...)
resuming bit-identically after an interrupt or an engine's death on real engines."""

from __future__ import annotations

import ast
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch

import pdl
from engines_harness import Recorder
from pdl import checkpoint
from pdl.checkpoint import CheckpointError
from pdl.process import pid_alive
from pdl_cinic10.model import ResNet18
from pdl_cinic10.train import Hyper, fit

needs_horovod = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("horovod"), reason="Horovod is not installed (scripts/setup --horovod)"
)


def temp_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(checkpoint.TEMP_SUFFIX))


def writer_pid(temp_name: str) -> int:
    """The pid in a temp file's name ``.<target>.<host>.<pid>.<random>.tmp``."""
    return int(temp_name.rsplit(".", 3)[1])


# -- the file -------------------------------------------------------------------------


class Payload:
    """Stands for any pickled object that would run code when unpickled."""

    def __init__(self):
        self.x = 1


def _trained_objects(seed: int):
    """A model with BatchNorm, its SGD optimizer after one step (momentum state), and a generator."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).square().sum().backward()
    optimizer.step()
    generator = torch.Generator().manual_seed(seed)
    torch.rand(5, generator=generator)
    return model, optimizer, generator


@pytest.mark.unit
def test_save_then_load_restores_objects_in_place_and_returns_plain_entries(tmp_path):
    model, optimizer, generator = _trained_objects(0)
    path = tmp_path / "run" / "ckpt.pt"  # the folder is created
    plain = {"epoch": 3, "history": [{"loss": 1.25, "note": "ok"}], "tag": ("a", None), "mask": torch.arange(4)}

    assert pdl.save_checkpoint(path, model=model, optimizer=optimizer, generator=generator, **plain) == path

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["ckpt.pt"]  # no temp file left behind
    model2, optimizer2, generator2 = _trained_objects(1)
    rest = pdl.load_checkpoint(path, model=model2, optimizer=optimizer2, generator=generator2)
    assert rest.keys() == plain.keys() and torch.equal(rest.pop("mask"), plain.pop("mask"))
    assert rest == plain
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, model2.state_dict()[name]), name
    momentum = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert all(torch.equal(a, optimizer2.state[p]["momentum_buffer"]) for a, p in zip(momentum, model2.parameters()))
    assert torch.equal(torch.rand(5, generator=generator), torch.rand(5, generator=generator2))

    pdl.save_checkpoint(path, epoch=4)  # replaces the file
    assert checkpoint.read(path) == {"epoch": 4}
    assert pdl.load_checkpoint(tmp_path / "none.pt", model=model2) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    "value", [lambda: 1, Payload(), {"nested": [object()]}], ids=["lambda", "own class", "nested"]
)
def test_save_refuses_what_weights_only_loading_would_refuse_before_touching_the_file(tmp_path, value):
    path = tmp_path / "ckpt.pt"
    checkpoint.save(path, epoch=1)
    with pytest.raises(TypeError, match=r"checkpoint entry bad.* weights_only refuses"):
        checkpoint.save(path, epoch=2, bad=value)
    assert checkpoint.read(path) == {"epoch": 1}
    assert temp_files(tmp_path) == []


def one_line_error(path, match):
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert match in message, message
    return message


@pytest.mark.unit
def test_load_refuses_pickled_objects_and_damaged_files_with_one_line_naming_the_file(tmp_path):
    with_object = tmp_path / "object.pt"
    torch.save({"format": checkpoint.FORMAT, "state": {"epoch": 1, "x": Payload()}}, with_object)
    message = one_line_error(with_object, "weights_only")
    assert "Payload" in message

    good = tmp_path / "good.pt"
    checkpoint.save(good, weights=torch.randn(1000))
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    one_line_error(truncated, "cannot load checkpoint")
    (tmp_path / "empty.pt").write_bytes(b"")
    one_line_error(tmp_path / "empty.pt", "cannot load checkpoint")

    foreign = tmp_path / "foreign.pt"
    torch.save({"epoch": 1}, foreign)
    one_line_error(foreign, "not written by pdl.checkpoint.save")
    with pytest.raises(CheckpointError, match=r"good\.pt: no entry 'model'"):
        checkpoint.load(good, model=torch.nn.Linear(1, 1))


@pytest.mark.unit
def test_save_removes_temp_files_of_dead_writers_only(tmp_path):
    path = tmp_path / "ckpt.pt"
    host = checkpoint._host()
    dead = tmp_path / f".ckpt.pt.{host}.{2**31 - 1}.abc123{checkpoint.TEMP_SUFFIX}"  # beyond any pid_max
    alive = tmp_path / f".ckpt.pt.{host}.{os.getpid()}.def456{checkpoint.TEMP_SUFFIX}"
    other = tmp_path / f".other.pt.{host}.{2**31 - 1}.ghi789{checkpoint.TEMP_SUFFIX}"
    for p in (dead, alive, other):
        p.write_bytes(b"partial")

    checkpoint.save(path, epoch=1)

    assert temp_files(tmp_path) == sorted([alive.name, other.name])


#: Runs in a subprocess: forks a writer per "write" (which continues the counter from the
#: checkpoint and saves forever), reports its wait status at "reap". Forked so that each
#: writer starts in milliseconds (torch is imported once); no OpenMP pool exists before the fork.
WRITER = r"""
import os, sys, traceback
import torch
from pdl import checkpoint

torch.set_num_threads(1)
path = sys.argv[1]

def write_forever():
    state = checkpoint.load(path)
    counter = state["counter"] if state is not None else 0
    while True:
        counter += 1
        checkpoint.save(path, counter=counter, data=torch.full((1 << 20,), float(counter)))  # 4 MB

child = None
for command in sys.stdin:
    if command.strip() == "write":
        child = os.fork()
        if child == 0:
            try:
                write_forever()
            except BaseException:
                traceback.print_exc()
            os._exit(1)
        print(child, flush=True)
    elif command.strip() == "reap":
        print(os.waitpid(child, 0)[1], flush=True)
    else:
        break
"""


@pytest.mark.integration
@pytest.mark.timing
def test_killing_the_writer_at_random_points_never_leaves_an_unloadable_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    helper = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    rng = random.Random(1234)
    counter, advanced, killed_mid_write = 0, 0, 0
    try:
        for round_ in range(20):
            helper.stdin.write("write\n")
            helper.stdin.flush()
            pid = int(helper.stdout.readline())
            time.sleep(rng.uniform(0.05, 0.3))
            os.kill(pid, signal.SIGKILL)
            helper.stdin.write("reap\n")
            helper.stdin.flush()
            status = int(helper.stdout.readline())
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                f"round {round_}: the writer exited by itself (status {status}) instead of being killed")

            state = checkpoint.load(path)  # never raises: the file is always complete
            if state is None:
                assert counter == 0
                continue
            assert state["data"].shape == (1 << 20,)
            assert bool((state["data"] == state["counter"]).all()), f"round {round_}: counter and data disagree"
            assert state["counter"] >= counter
            temps = temp_files(tmp_path)
            killed_mid_write += any(writer_pid(t) == pid for t in temps)
            if state["counter"] > counter:  # this writer completed a save, which ran the cleanup first
                advanced += 1
                assert all(writer_pid(t) == pid for t in temps), f"round {round_}: stale temp files {temps}"
            counter = state["counter"]
    finally:
        helper.kill()
        helper.wait()
    assert advanced >= 5, f"only {advanced} of 20 writers completed a save"
    assert killed_mid_write >= 1, "no kill landed in the middle of a write"
    checkpoint.save(path, counter=counter + 1)
    assert temp_files(tmp_path) == [] and checkpoint.read(path) == {"counter": counter + 1}


# -- fit(checkpoint=...) in one process -------------------------------------------------


def _tiny_run(hp: Hyper, checkpoint_path=None, *, stop_after_epoch: int | None = None, model=None):
    """fit ``model`` (default: a fresh seeded one) on a tiny random dataset; returns
    (result, log lines). ``stop_after_epoch``: raise KeyboardInterrupt from the log
    call of that epoch (which comes after its checkpoint)."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (192, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (192,), generator=g)
    lines = []

    def log(line):
        lines.append(line)
        if stop_after_epoch is not None and line.startswith(f"epoch {stop_after_epoch}/"):
            raise KeyboardInterrupt

    if model is None:
        torch.manual_seed(0)
        model = ResNet18(width=hp.width)
    result = fit(model, (images[:128], labels[:128]), (images[128:], labels[128:]), hp,
                 device="cpu", log=log, checkpoint=checkpoint_path)
    return result, lines


TINY = dict(batch_size=32, width=4, bf16=False, channels_last=False, compile=False, tta=False)


def scores(result):
    return [(r["epoch"], r["train_loss"], r["test_acc"]) for r in result["history"]]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.fixture
def deterministic():
    threads, enabled = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    yield
    torch.use_deterministic_algorithms(enabled)
    torch.set_num_threads(threads)


@pytest.mark.unit
def test_fit_resumed_after_an_exception_equals_an_uninterrupted_run_and_a_finished_one_returns(
    tmp_path, deterministic
):
    hp = Hyper(epochs=3, **TINY)
    reference, _ = _tiny_run(hp)
    path = tmp_path / "fit.pt"
    with pytest.raises(KeyboardInterrupt):
        _tiny_run(hp, path, stop_after_epoch=2)

    resumed, lines = _tiny_run(hp, path)

    assert lines[0] == f"resuming from {path}: 2/3 epochs done"
    assert [line.split()[1] for line in lines[1:]] == ["3/3"]
    assert scores(resumed) == scores(reference)
    assert_same_weights(resumed["model"], reference["model"])

    again, lines = _tiny_run(hp, path)  # finished: nothing to train
    assert lines == [f"resuming from {path}: 3/3 epochs done"]
    assert scores(again) == scores(reference) and again["test_acc"] == reference["test_acc"]
    assert_same_weights(again["model"], reference["model"])


@pytest.mark.unit
def test_fit_refuses_a_checkpoint_of_other_settings_in_one_line_naming_path_and_fields(tmp_path):
    path = tmp_path / "fit.pt"
    _tiny_run(Hyper(epochs=1, **TINY), path)
    model = ResNet18(width=4)
    untouched = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    with pytest.raises(ValueError) as info:
        _tiny_run(Hyper(epochs=2, lr=0.2, **TINY), path, model=model)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "epochs 1 (now 2)" in message and "lr 0.1 (now 0.2)" in message and "seed" not in message

    state = checkpoint.read(path)
    checkpoint.save(path, **{**state, "world": 2})
    with pytest.raises(ValueError, match=r"world size 2 \(now 1\)") as info:
        _tiny_run(Hyper(epochs=1, **TINY), path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert checkpoint.read(path)["world"] == 2  # refused before anything was written
    for name, tensor in model.state_dict().items():  # refused before the weights were loaded
        assert torch.equal(tensor, untouched[name]), name


# -- on real engines ---------------------------------------------------------------------


def run(session, code, n=2, **kwargs):
    """session.run with its output captured (returns result, out, err)."""
    out, err = Recorder(), Recorder()
    result = session.run(code, n, out=out, err=err, **kwargs)
    return result, out, err


def values(result):
    return [ast.literal_eval(v) for v in result.values]


#: Each rank names its own file, so the cell shows which ranks touch files: only rank 0's
#: name is written, and rank 1 loads rank 0's state though its own file does not exist.
SAVE_AND_LOAD = """
import os, torch
from pdl import checkpoint
path = os.path.join({folder!r}, f"rank{{rank}}.pt")
checkpoint.save(path, weights=torch.full((3,), 7.0), epoch=5)
written = os.path.exists(path)
state = checkpoint.load(path)
missing = checkpoint.load(path + ".missing")
if rank == 0:
    with open(path, "wb") as f:
        f.write(b"damaged")
try:
    checkpoint.load(path)
    damaged = None
except checkpoint.CheckpointError as e:
    damaged = str(e)
(written, state["weights"].tolist(), state["epoch"], missing, damaged)
"""


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["torch", pytest.param("horovod", marks=needs_horovod)])
def test_only_rank0_writes_and_its_reads_reach_every_rank(pdl_session, tmp_path, backend):
    result, _, _ = run(pdl_session, SAVE_AND_LOAD.format(folder=str(tmp_path)), backend=backend)

    damaged = f"cannot load checkpoint {tmp_path / 'rank0.pt'}: "
    (written0, *rest0), (written1, *rest1) = values(result)
    assert (written0, written1) == (True, False)
    assert os.listdir(tmp_path) == ["rank0.pt"]
    assert rest0[:3] == rest1[:3] == [[7.0, 7.0, 7.0], 5, None]
    assert rest0[3] == rest1[3] and rest0[3].startswith(damaged), rest0[3]


#: The training cell: ResNet18(width=4) on 256 random 32x32 images, 4 epochs, deterministic
#: on the CPU. Returns ([(epoch, train_loss, test_acc)], sha256 of the final state dict).
#: ``pause`` seconds after the "epoch 2/4" line (rank 0) leave time to stop the run there.
TRAIN = """
import hashlib, time, torch
from pdl_cinic10.model import ResNet18
from pdl_cinic10.train import Hyper, fit
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
images = torch.randint(0, 256, (320, 3, 32, 32), dtype=torch.uint8, generator=g)
labels = torch.randint(0, 10, (320,), generator=g)
hp = Hyper(epochs=4, batch_size=32, width=4, bf16=False, channels_last=False, compile=False, tta=False)

def log(line):
    print(line, flush=True)
    if line.startswith("epoch 2/"):
        time.sleep({pause})

torch.manual_seed(rank)  # different initial weights on each rank: DDP starts all from rank 0's
result = fit(ResNet18(width=hp.width), (images[:256], labels[:256]), (images[256:], labels[256:]), hp,
             device="cpu", log=log, checkpoint={checkpoint!r})
state = result["model"].state_dict()
digest = hashlib.sha256(b"".join(name.encode() + t.numpy().tobytes() for name, t in state.items()))
([(r["epoch"], r["train_loss"], r["test_acc"]) for r in result["history"]], digest.hexdigest())
"""


def train(session, checkpoint_path=None, *, pause=0.0, on_output=None):
    out, err = Recorder(on_write=on_output), Recorder()
    code = TRAIN.format(checkpoint=None if checkpoint_path is None else str(checkpoint_path), pause=pause)
    # the split fixed (no balancing to measured speeds): bit-identical results need one
    result = session.run(code, 2, out=out, err=err, balance="off")
    return values(result), out.text()


def stopped_then_resumed(session, path, stop, reference, *, pause):
    """Run the training cell with a checkpoint, ``stop`` it once epoch 2's line is out
    (rank 0 then pauses ``pause`` s), rerun it, and check that the rerun continued
    from epoch 2's checkpoint to the reference's exact result."""
    stopped = []

    def stop_at_epoch2(text):
        if "epoch 2/4" in text and not stopped:
            stopped.append(time.monotonic())
            stop()

    with pytest.raises(BaseException) as info:
        train(session, path, pause=pause, on_output=stop_at_epoch2)
    assert stopped, f"the run ended before epoch 2: {info.value!r}"
    assert path.exists()

    (first, second), text = train(session, path)

    assert text.splitlines()[0] == f"resuming from {path}: 2/4 epochs done", text
    assert "epoch 1/4" not in text and "epoch 2/4" not in text and "epoch 4/4" in text
    assert first == second  # both ranks hold the same model
    assert first == reference  # losses, accuracies and weights: bit-identical (==)
    return info.value


@pytest.fixture(scope="module")
def uninterrupted(pdl_session):
    (first, second), text = train(pdl_session)
    assert first == second and [e for e, _, _ in first[0]] == [1, 2, 3, 4], text
    return first


@pytest.mark.integration
def test_a_run_interrupted_by_ctrl_c_resumes_bit_identically(pdl_session, uninterrupted, tmp_path):
    def ctrl_c():  # as the notebook's interrupt button does to the kernel
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()

    # rank 0 is still in its pause when the interrupt arrives; rank 1 waits in epoch 3's first collective
    stopped = stopped_then_resumed(pdl_session, tmp_path / "run.pt", ctrl_c, uninterrupted, pause=3.0)
    assert isinstance(stopped, KeyboardInterrupt)


@pytest.mark.integration
def test_a_run_whose_engine_was_killed_resumes_bit_identically(pdl_session, uninterrupted, tmp_path):
    result, _, _ = run(pdl_session, "import os\nos.getpid()")
    victim = values(result)[1]

    def kill_rank1():
        os.kill(victim, signal.SIGKILL)

    # rank 0 wakes from its pause into epoch 3, where its first collective finds rank 1 gone
    stopped = stopped_then_resumed(pdl_session, tmp_path / "run.pt", kill_rank1, uninterrupted, pause=0.5)
    assert type(stopped).__name__ == "RankFailed" and stopped.rank == 1, repr(stopped)
    assert not pid_alive(victim)
    result, _, _ = run(pdl_session, "import os\nos.getpid()")
    assert values(result)[1] != victim  # the rerun ran on a fresh engine
