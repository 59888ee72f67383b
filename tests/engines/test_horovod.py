"""``--backend horovod`` against a real local cluster of three CPU-slot engines (gloo).

The notebook kernel (this process) runs Horovod's rendezvous; the engines call
``hvd.init()`` with the environment it hands them. Failure behaviour must match
the torch backend (tests/notebook/test_session.py). Skipped where Horovod is not
installed (``scripts/setup --horovod``); the plan/env builders are tested always.
"""

from __future__ import annotations

import ast
import socket
import time

import pytest

from engines_harness import Recorder, interrupt_running_loop, strip_ansi
from pdl_magics import DistributedUsageError, RankFailed
from pdl_magics.horovod_driver import Slot, plan, rank_env

needs_horovod = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("horovod"), reason="Horovod is not installed (scripts/setup --horovod)"
)

HVD_SUM_RANK_PLUS_ONE = """
import torch
hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
"""


def run(session, code, n=3, backend="horovod", **kwargs):
    """session.run with its output captured (returns result, out, err)."""
    out, err = Recorder(), Recorder()
    result = session.run(code, n, backend=backend, out=out, err=err, **kwargs)
    return result, out, err


def values(result):
    return [ast.literal_eval(v) for v in result.values]


# -- the driver's pure builders --------------------------------------------------------


@pytest.mark.unit
def test_plan_gives_local_and_cross_ranks_like_horovodrun():
    assert plan(["a", "a", "b"]) == [
        Slot("a", rank=0, local_rank=0, cross_rank=0, size=3, local_size=2, cross_size=2),
        Slot("a", rank=1, local_rank=1, cross_rank=0, size=3, local_size=2, cross_size=1),
        Slot("b", rank=2, local_rank=0, cross_rank=1, size=3, local_size=1, cross_size=2),
    ]
    with pytest.raises(ValueError, match="not contiguous"):
        plan(["a", "b", "a"])


@pytest.mark.unit
@needs_horovod
def test_plan_equals_horovods_own_host_assignment():
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    hosts = ["n1", "n1", "n1", "n2", "n3", "n3"]
    theirs = get_host_assignments(parse_hosts("n1:3,n2:1,n3:2"), len(hosts))
    assert [vars(s) for s in plan(hosts)] == [vars(s) for s in theirs]


@pytest.mark.unit
def test_rank_env_is_the_gloo_environment_of_that_rank():
    slot = Slot("node2", rank=2, local_rank=0, cross_rank=1, size=3, local_size=1, cross_size=2)
    assert rank_env(slot, "10.0.0.5", 4321, timeout_s=1800.0) == {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.5",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321",
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "30",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1800",
        "HOROVOD_HOSTNAME": "node2",
        "HOROVOD_RANK": "2",
        "HOROVOD_SIZE": "3",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
    }


# -- on three engines --------------------------------------------------------------------


@pytest.mark.integration
@needs_horovod
def test_each_rank_has_hvd_initialised_with_its_rank(pdl_session):
    result, _, _ = run(
        pdl_session,
        "import os\n(hvd.rank(), hvd.size(), hvd.local_rank(), rank, world_size, local_rank, str(device),"
        " os.environ['HOROVOD_GLOO_IFACE'], os.environ['HOROVOD_HOSTNAME'])",
    )
    host = socket.gethostname()
    assert values(result) == [(r, 3, r, r, 3, r, "cpu", "lo", host) for r in range(3)]
    result, _, _ = run(pdl_session, HVD_SUM_RANK_PLUS_ONE)
    assert result.values == ["6.0", "6.0", "6.0"]  # 1 + 2 + 3 on every rank


@pytest.mark.integration
@needs_horovod
def test_switching_backends_between_cells_keeps_the_engines(pdl_session):
    pids = values(run(pdl_session, "import os\nos.getpid()", backend="torch")[0])
    torch_sum = "import torch, torch.distributed as dist\nt = torch.tensor([float(rank + 1)])\ndist.all_reduce(t)\nt.item()"
    for backend, code in [("horovod", HVD_SUM_RANK_PLUS_ONE), ("torch", torch_sum), ("horovod", HVD_SUM_RANK_PLUS_ONE),
                          ("torch", torch_sum)]:
        started = time.monotonic()
        result, _, err = run(pdl_session, code, backend=backend)
        assert result.values == ["6.0"] * 3, backend
        assert time.monotonic() - started < 30
        assert "restarting" not in err.text()
        # one group at a time: the other backend was torn down on every rank
        other = ("hvd.is_initialized()" if backend == "torch"
                 else "import torch.distributed as dist\ndist.is_initialized()")
        assert run(pdl_session, other, backend=backend)[0].values == ["False"] * 3
    assert values(run(pdl_session, "import os\nos.getpid()", backend="torch")[0]) == pids


@pytest.mark.integration
@needs_horovod
def test_changing_the_number_of_horovod_ranks_and_back(pdl_session):
    code = HVD_SUM_RANK_PLUS_ONE.strip() + "\n(hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item())"
    for n in (3, 2, 1, 3):
        started = time.monotonic()
        result, _, _ = run(pdl_session, code, n=n)
        assert values(result) == [(n, float(n))] * n
        assert time.monotonic() - started < 30


@pytest.mark.integration
@needs_horovod
def test_a_failing_rank_releases_peers_blocked_in_a_horovod_collective(pdl_session):
    run(pdl_session, "kept = rank * 10")
    err = Recorder()
    started = time.monotonic()
    with pytest.raises(RankFailed) as info:
        pdl_session.run(
            """
import time, torch
if rank == 2:
    time.sleep(0.3)  # ranks 0 and 1 are already waiting in the allreduce
    raise RuntimeError("root cause on rank 2")
hvd.allreduce(torch.ones(1))
""",
            3, backend="horovod", out=Recorder(), err=err,
        )
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"took {elapsed:.1f} s to report the failure"
    e = info.value
    assert (e.rank, e.host, e.ename, e.evalue) == (2, socket.gethostname(), "RuntimeError", "root cause on rank 2")
    assert 'raise RuntimeError("root cause on rank 2")' in strip_ansi("\n".join(e.remote_traceback))
    assert "ranks 0, 1 were stopped" in e.note
    assert "restarting its engine" not in err.text(), f"peers were killed, not released:\n{err.text()}"

    result, _, _ = run(pdl_session, "(rank, kept)")  # state survived
    assert values(result) == [(0, 0), (1, 10), (2, 20)]
    result, _, _ = run(pdl_session, HVD_SUM_RANK_PLUS_ONE)  # and Horovod works again
    assert result.values == ["6.0", "6.0", "6.0"]


@pytest.mark.integration
@needs_horovod
def test_a_rank_failing_mid_training_with_distributed_optimizer(pdl_session):
    run(
        pdl_session,
        """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
""",
    )
    with pytest.raises(RankFailed) as info:
        run(
            pdl_session,
            """
import time
if rank == 0:
    time.sleep(0.3)  # ranks 1 and 2 are in backward()'s gradient allreduce
    raise ValueError("bad batch on rank 0")
opt.zero_grad()
model(torch.randn(8, 4)).sum().backward()
opt.step()
""",
        )
    assert (info.value.rank, info.value.evalue) == (0, "bad batch on rank 0")
    # the next cell trains on: the optimizer works on the rebuilt Horovod world
    result, _, _ = run(
        pdl_session,
        """
opt.zero_grad()
model(torch.full((8, 4), float(rank))).sum().backward()
opt.step()
model.weight.grad.tolist()
""",
    )
    assert values(result) == [[[8.0] * 4]] * 3  # mean over ranks of 8 * rank = 8 * 1


@pytest.mark.integration
@needs_horovod
@pytest.mark.parametrize("loop", ["training", "tight"])
def test_interrupt_stops_every_rank_in_horovod_collectives(pdl_session, loop):
    body = {
        "training": "b = a @ a\n    hvd.allreduce(torch.ones(1))\n    time.sleep(0.01)",
        "tight": "hvd.allreduce(torch.ones(1))",
    }[loop]
    elapsed, err = interrupt_running_loop(pdl_session, body, backend="horovod")
    assert elapsed < 25, f"run() took {elapsed:.1f} s to return after the interrupt"
    assert "Interrupted: all 3 ranks stopped." in err.text()
    assert "restarting its engine" not in err.text()

    result, _, _ = run(pdl_session, HVD_SUM_RANK_PLUS_ONE)
    assert result.values == ["6.0", "6.0", "6.0"]
    result, _, _ = run(pdl_session, "steps")
    assert all(int(v) >= 5 for v in result.values)


@pytest.mark.integration
@needs_horovod
def test_an_engine_without_horovod_is_a_one_line_usage_error(pdl_session):
    run(pdl_session, "pass", backend="torch")
    hide = "import sys\nif rank == 1:\n    saved = sys.modules.get('horovod.torch')\n    sys.modules['horovod.torch'] = None\n"
    run(pdl_session, hide, backend="torch")
    try:
        with pytest.raises(DistributedUsageError) as info:
            run(pdl_session, "pass")
        message = str(info.value)
        assert "\n" not in message
        assert "rank 1" in message and "scripts/setup --horovod" in message
    finally:
        run(pdl_session, "if rank == 1:\n    sys.modules['horovod.torch'] = saved", backend="torch")
    assert run(pdl_session, HVD_SUM_RANK_PLUS_ONE)[0].values == ["6.0"] * 3


@pytest.mark.unit
@needs_horovod
def test_the_installed_horovod_has_the_fix_for_ranks_on_several_hosts(monkeypatch):
    from pdl.runtime import engine, horovod_group as horovod_engine

    # what scripts/setup --horovod installed: the patched build, usable across hosts
    assert horovod_engine.fixed_for_hosts(), horovod_engine.installed_version()
    assert engine.horovod_problem(across_hosts=True) is None
    # a Horovod as released would crash in hvd.init() across containers: refused in one line
    monkeypatch.setattr(horovod_engine, "installed_version", lambda: "0.28.1")
    assert engine.horovod_problem(across_hosts=False) is None
    problem = engine.horovod_problem(across_hosts=True)
    assert problem and "\n" not in problem and "horovod 0.28.1 lacks" in problem


# -- CINIC-10 training with Horovod ------------------------------------------------------


TRAIN_WITH_HOROVOD = """
import hashlib, torch
from pdl_cinic10.data import load_split
from pdl_cinic10.model import ResNet18
from pdl_cinic10.train import Hyper, fit

def digest(module):
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode()); h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

torch.manual_seed(rank)  # different initial weights on every rank: the broadcast must fix that
train, test = load_split({root!r}, "train", workers=1), load_split({root!r}, "test", workers=1)
# 3 ranks x 16 images a step, near the DDP test's 2 x 32: enough steps in 4 epochs to
# learn far above chance however Horovod's fusion groups the sums (that grouping, and
# so the rounding, changes run to run: at 3 x 32 the accuracy ranged from 0.44 to 0.77)
# lr 0.075 per 256: fit scales it by 0.25 (48 images a step is under LR_SCALE's floor),
# the 0.01875 this test learned with before that floor: 0.82 to 0.86 test accuracy in 5
# runs; at 0.05 it ended at 0.43 to 0.47 in 3 of 4 runs (CI failed on it)
# An even split (balance off): balanced to the engines' timing, the split (and with it
# the run, 21 steps an epoch) would change from one machine load to the next
hp = Hyper(epochs=4, batch_size=16, width=16, lr=0.075)
model = ResNet18(width=hp.width)
before = digest(model)
lines = []
result = fit(model, train, test, hp, device=device, log=lines.append, backend="horovod", balance="off")
(before, digest(result["model"]), result["test_acc"], sum(line.startswith("epoch ") for line in lines),
 [line for line in lines if not line.startswith("epoch ")])
"""


@pytest.mark.integration
@needs_horovod
@pytest.mark.timeout(400)
def test_cinic10_fit_with_horovod_learns_and_ends_identical_on_every_rank(pdl_session, tmp_path):
    from pdl_cinic10.sample import make_sample

    root = make_sample(tmp_path / "sample")
    result, out, _ = run(pdl_session, TRAIN_WITH_HOROVOD.format(root=str(root)))
    ranks = values(result)
    before = [r[0] for r in ranks]
    assert len(set(before)) == 3, "ranks did not start from different weights"
    after = {r[1] for r in ranks}
    assert len(after) == 1, "parameters/buffers differ between ranks after training"
    assert after.isdisjoint(before)
    accuracy = {r[2] for r in ranks}
    assert len(accuracy) == 1 and accuracy.pop() >= 0.5  # chance is 0.1
    assert [r[3] for r in ranks] == [4, 0, 0]  # one log line per epoch, on rank 0 only
    assert [r[4] for r in ranks] == [[], [], []]  # and no other line


@pytest.mark.integration
@needs_horovod
@pytest.mark.timeout(400)
def test_the_cinic10_notebook_trains_with_horovod_by_setting_one_variable(pdl_session, monkeypatch, tmp_path):
    import re
    from pathlib import Path

    import nbformat
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from pdl_magics import DistributedSession

    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "cinic10_distributed.ipynb"
    cells = [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    engine_env = {"CINIC10_DIR": str(tmp_path / "no-cinic10-here"), "CINIC10_EPOCHS": "3",
                  "CINIC10_WIDTH": "16", "CINIC10_BATCH": "32"}
    run(pdl_session, f"import os\nos.environ.update({engine_env!r})", backend="torch")
    monkeypatch.setenv("CINIC10_BACKEND", "horovod")  # the one option, read by the notebook's first cell
    monkeypatch.setattr(DistributedSession, "_default", pdl_session)  # %load_ext uses these engines

    ip = InteractiveShell.instance()
    ip.extension_manager.loaded.discard("pdl_magics")
    try:
        with capture_output() as cap:
            for source in cells:
                result = ip.run_cell(source)
                assert result.success, f"cell failed:\n{source}\n{cap.stdout}\n{cap.stderr}"
    finally:
        ip.extension_manager.loaded.discard("pdl_magics")
    log = cap.stdout
    assert "3 ranks on cpu" in log and re.search(r"epoch 3/3", log), log
    assert float(re.search(r"test accuracy: ([\d.]+)%", log).group(1)) >= 30.0, log  # chance is 10%
    # every cell ran under Horovod: the model was trained by hvd.DistributedOptimizer
    check = run(pdl_session, "(hvd.is_initialized(), type(result['model']).__name__)")[0]
    assert values(check) == [(True, "ResNet18")] * 3
