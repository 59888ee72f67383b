"""PDL's GPU paths on this machine's CUDA GPUs (marker ``gpu``; skipped without one).

``scripts/gpu-check`` runs them on a GPU machine (``pytest -m gpu``); elsewhere they
skip with the reason. Engines are real: one per GPU of this machine (``nvidia-smi``'s
order), started by a :class:`~pdl_magics.DistributedSession` over ``gpu:<i>`` slots.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import subprocess

import pytest
import torch

from engines_harness import interrupt_running_loop
from pdl.slots import detect_gpus
from pdl_cinic10 import CLASSES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

#: bf16 + channels_last + compile may differ from fp32 by this much (relative) in one
#: batch's loss, same weights and images (bfloat16 keeps 8 bits of mantissa: ~0.4 %).
RECIPE_LOSS_TOLERANCE = 0.02
#: ... and their gradients at least this similar (cosine over all parameters, at the
#: random start where bf16 rounding weighs most: 0.957 measured on an H200).
RECIPE_GRADIENT_COSINE = 0.9
MIB = 1 << 20
GIB = 1 << 30


def nvidia_smi(*fields: str) -> list[list[str]]:
    """One row per GPU of ``nvidia-smi --query-gpu=<fields>``."""
    out = subprocess.run([shutil.which("nvidia-smi") or "nvidia-smi", f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30, check=True)
    return [[v.strip() for v in line.split(",")] for line in out.stdout.strip().splitlines()]


@pytest.fixture(scope="module")
def gpus() -> list[str]:
    slots = detect_gpus()
    assert slots, "torch sees a GPU but nvidia-smi lists none"
    return slots


@pytest.fixture(scope="module")
def session(gpus):
    from pdl_magics import DistributedSession

    s = DistributedSession(local_slots=gpus)
    yield s
    s.close()


def run_json(session, cell: str, n: int, **kwargs) -> list[dict]:
    """Run ``cell`` on ``n`` ranks; the JSON object each rank printed, in output order."""
    out = io.StringIO()
    session.run(cell, n, all_output=True, out=out, **kwargs)
    return [json.loads(m) for m in re.findall(r"\{.*\}", out.getvalue())]


#: A cell that runs ``fit`` as the notebook does, on this rank's own copy of the synthetic
#: sample (100 train and 20 test images a class), with ``backend`` and ``Hyper(**hyper)``
#: filled in. It records what fit's backend made of the model and the optimizer (by
#: wrapping the ``distribute`` of the collectives fit asks for) and prints one JSON object.
FIT_CELL = """
import json, tempfile
import torch, torch._dynamo
from pdl_cinic10 import train as training
from pdl_cinic10.cache import load
from pdl_cinic10.compile_support import compile_problem
from pdl_cinic10.model import ResNet18
from pdl_cinic10.sample import make_sample

def kind(obj):
    return f"{type(obj).__module__}.{type(obj).__name__}"

def fit_and_report(backend, hyper):
    made = []  # (net, optimizer) as fit's collectives returned them
    for_backend = training.for_backend

    def recording_for_backend(name):
        comm = for_backend(name)
        distribute = comm.distribute
        def recording_distribute(module, optimizer):
            made.append(distribute(module, optimizer))
            return made[-1]
        comm.distribute = recording_distribute
        return comm

    with tempfile.TemporaryDirectory() as root:
        make_sample(root, train_per_class=100, test_per_class=20, valid_per_class=1)
        train, test = [load(root, split, device=device, cache_dir=f"{root}/cache") for split in ("train", "test")]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    lines = []
    training.for_backend = recording_for_backend
    try:
        result = training.fit(ResNet18(width=hyper["width"]).to(device), train, test, training.Hyper(**hyper),
                              device=device, backend=backend, log=lines.append)
    finally:
        training.for_backend = for_backend
    return {"rank": rank, "world": world_size, "losses": [h["train_loss"] for h in result["history"]],
            "test_acc": result["test_acc"], "made": [[kind(net), kind(opt)] for net, opt in made],
            "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"], "compile_off": compile_problem(),
            "weights": sum(p.detach().double().sum() for p in result["model"].parameters()).item(),
            "log": lines}

print(json.dumps(fit_and_report(%r, %r)))
"""


def fit_on_every_gpu(session, gpus, backend: str, **hyper) -> list[dict]:
    """:data:`FIT_CELL` on one rank per GPU; asserts that every rank reported, in a world
    of them all, with a finite loss every epoch, that fit distributed the model once, and
    that the ranks end with the same weights. Returns the reports."""
    seen = run_json(session, FIT_CELL % (backend, hyper), len(gpus), backend=backend)
    assert sorted(s["rank"] for s in seen) == list(range(len(gpus))), seen
    assert all(s["world"] == len(gpus) for s in seen), seen
    assert all(len(s["losses"]) == hyper["epochs"] and all(map(math.isfinite, s["losses"])) for s in seen), seen
    assert all(len(s["made"]) == 1 for s in seen), [s["made"] for s in seen]
    weights = [s["weights"] for s in seen]
    assert max(weights) - min(weights) <= 1e-6 * max(1.0, *map(abs, weights)), f"replicas diverged: {weights}"
    return seen


@pytest.fixture
def horovod():
    """``horovod.torch``; skips the test where Horovod is missing or built without NCCL."""
    hvd = pytest.importorskip("horovod.torch")
    if not hvd.nccl_built():
        pytest.skip("this Horovod was built without NCCL (scripts/build-horovod with HOROVOD_GPU_OPERATIONS=NCCL)")
    return hvd


def test_each_engine_sees_exactly_its_reserved_gpu(session, gpus):
    cell = """
import json, os, torch
props = torch.cuda.get_device_properties(0)
print(json.dumps({"rank": rank, "slot": os.environ["PDL_SLOT"], "visible": os.environ["CUDA_VISIBLE_DEVICES"],
                  "count": torch.cuda.device_count(), "device": str(device), "uuid": str(props.uuid)}))
"""
    seen = run_json(session, cell, len(gpus))
    uuids = {int(index): uuid.removeprefix("GPU-") for index, uuid in nvidia_smi("index", "uuid")}
    assert sorted(s["slot"] for s in seen) == sorted(gpus)
    for s in seen:
        index = int(s["slot"].split(":")[1])
        assert s["visible"] == str(index) and s["count"] == 1 and s["device"] == "cuda:0", s
        assert s["uuid"] == uuids[index], (s, uuids)


def test_an_nccl_group_all_reduces_on_every_gpu(session, gpus):
    cell = """
import json, torch, torch.distributed as dist
t = torch.full((1024,), float(rank + 1), device=device)
dist.all_reduce(t)
print(json.dumps({"backend": dist.get_backend(), "sum": t[0].item(), "world": world_size}))
"""
    seen = run_json(session, cell, len(gpus))
    n = len(gpus)
    assert len(seen) == n and all(s == {"backend": "nccl", "sum": n * (n + 1) / 2, "world": n} for s in seen), seen


def test_ddp_trains_a_few_steps_on_the_gpu(session, gpus):
    cell = """
import json, torch
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(rank)
model = DDP(torch.nn.Linear(256, 1).to(device), device_ids=[device.index])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torch.linspace(-1, 1, 256, device=device)[:, None]
losses = []
for step in range(100):
    x = torch.randn(512, 256, device=device)
    loss = ((model(x) - x @ w) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(json.dumps({"first": losses[0], "last": losses[-1], "weights": model.module.weight.sum().item()}))
"""
    seen = run_json(session, cell, len(gpus))
    assert all(s["last"] < 0.1 * s["first"] for s in seen), seen
    assert len({round(s["weights"], 4) for s in seen}) == 1, "DDP replicas diverged"


def test_fit_trains_under_ddp_compiled_on_every_gpu(session, gpus):
    """The notebook's path: ``fit`` in a cell on one rank per GPU, bf16, channels_last and
    compiled. Every rank trains (finite loss) through at least one compiled graph, fit
    wraps the model in DDP when there is more than one rank (in a world of one it trains
    it unwrapped), and the replicas end with the same weights."""
    seen = fit_on_every_gpu(session, gpus, "torch", epochs=1, width=32, bf16=True, channels_last=True, compile=True)
    for s in seen:
        net, _ = s["made"][0]
        assert net.endswith(".DistributedDataParallel") == (len(gpus) > 1), s
        assert s["graphs"] >= 1, f"no graph was compiled on rank {s['rank']} ({s['compile_off']}): {s}"


def test_the_recipe_runs_bf16_channels_last_and_compiled(tmp_path):
    """``fit``'s fast path really runs as its flags say: the network's first layer sees
    channels_last input and answers in bfloat16, and a compiled graph ran."""
    import torch._dynamo
    from pdl_cinic10.cache import load
    from pdl_cinic10.model import ResNet18
    from pdl_cinic10.sample import make_sample
    from pdl_cinic10.train import Hyper, fit

    make_sample(tmp_path, train_per_class=100, test_per_class=20, valid_per_class=1)
    device = torch.device("cuda")
    train, test = load(tmp_path, "train", device=device), load(tmp_path, "test", device=device)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    seen = []
    model = ResNet18(width=32)
    first_conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_hook(lambda _m, inputs, out: seen.append(
        (inputs[0].is_contiguous(memory_format=torch.channels_last), out.dtype)))
    result = fit(model, train, test, Hyper(epochs=1, width=32, bf16=True, channels_last=True, compile=True),
                 device=device)
    assert math.isfinite(result["history"][-1]["train_loss"]), result["history"]
    assert seen and all(s == (True, torch.bfloat16) for s in seen), seen[:3]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, dict(torch._dynamo.utils.counters["stats"])


def test_the_recipe_computes_what_fp32_does():
    """bf16 + channels_last + compile give the fp32 loss and gradient of one batch,
    within bfloat16's precision (same weights, same images)."""
    from pdl_cinic10.model import ResNet18

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = ResNet18(width=32).to(device)
    x = torch.randn(256, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (256,), device=device)

    def loss_and_grad(net, images, fast):
        net.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=fast):
            loss = torch.nn.functional.cross_entropy(net(images), y)
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten().float() for p in model.parameters()])

    fp32_loss, fp32_grad = loss_and_grad(model, x, False)
    model.to(memory_format=torch.channels_last)
    fast_loss, fast_grad = loss_and_grad(torch.compile(model), x.contiguous(memory_format=torch.channels_last), True)
    cosine = torch.nn.functional.cosine_similarity(fp32_grad, fast_grad, dim=0).item()
    assert abs(fast_loss - fp32_loss) <= RECIPE_LOSS_TOLERANCE * fp32_loss, (fast_loss, fp32_loss)
    assert cosine >= RECIPE_GRADIENT_COSINE, cosine


def test_a_checkpoint_saves_and_resumes_on_the_gpu(tmp_path):
    from pdl import checkpoint

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8).to(device)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 32, device=device)).sum().backward()
    opt.step()
    checkpoint.save(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=1)
    again = torch.nn.Linear(32, 8).to(device)
    again_opt = torch.optim.Adam(again.parameters())
    rest = checkpoint.load(tmp_path / "ckpt.pt", model=again, optimizer=again_opt)
    assert rest == {"step": 1}
    assert again.weight.device.type == "cuda" and torch.equal(again.weight, model.weight)
    state = next(iter(again_opt.state.values()))
    assert state["exp_avg"].device.type == "cuda"


def test_balanced_batches_find_the_gpus_memory_limit_and_run_a_larger_share_in_micro_batches():
    """pdl.balance on a GPU: the probe's peak memory at two sizes gives the images one
    pass fits in 90 % of the GPU (pdl/balance/helper.py), and a pass of that many images
    runs; a rank's share past a limit runs as micro-batches whose summed, weighted
    gradient is the whole share's."""
    from pdl.balance.batches import BalancedBatches
    from pdl.balance.helper import measure
    from pdl.balance.plan import Plan

    device = torch.device("cuda", 0)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(device)
    x = torch.randn(256, 3, 64, 64, device=device)
    y = torch.randint(0, 10, (256,), device=device)

    def probe(b: int) -> None:
        idx = torch.arange(b, device=device) % len(x)
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        model.zero_grad(set_to_none=True)

    fit, limit = measure(probe, 64, device)
    assert fit.per_image_s > 0 and limit is not None and limit > 64, (fit, limit)
    torch.cuda.reset_peak_memory_stats(device)
    probe(limit)  # fits: no OutOfMemoryError
    total = torch.cuda.get_device_properties(device).total_memory
    assert torch.cuda.max_memory_allocated(device) <= 0.95 * total, (limit, torch.cuda.max_memory_allocated(device))

    batches = BalancedBatches(64, Plan(64, (64,), (16,)), rank=0, rebalance_every=0, device=device)
    step = next(iter(batches.epoch(0)))
    parts = list(step.parts(model))
    assert [len(p.indices) for p in parts] == [16, 16, 16, 16]
    for part in parts:
        idx = part.indices.to(device)
        part.scaled(nn.functional.cross_entropy(model(x[idx]), y[idx])).backward()
    micro = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    idx = step.indices.to(device)
    nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
    for got, want in zip(micro, (p.grad for p in model.parameters())):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_after_ctrl_c_the_engines_gpu_memory_is_reused_not_leaked(session, gpus):
    """Each rank's reserved GPU memory (torch's caching allocator): interrupting a loop
    that holds a 512 MiB buffer leaves at least that much more than before it (the loop
    really ran on the GPU), and interrupting it again adds at most 64 MiB (the memory of
    the first is reused, not leaked)."""
    body = "b = torch.empty(512 << 20, dtype=torch.uint8, device=device); b.fill_(1); torch.cuda.synchronize()"
    report = "import json, torch\nprint(json.dumps({'rank': rank, 'reserved': torch.cuda.memory_reserved()}))"

    def reserved() -> list[int]:
        """Each rank's reserved bytes, in rank order."""
        seen = sorted(run_json(session, report, len(gpus)), key=lambda s: s["rank"])
        assert len(seen) == len(gpus), f"{len(seen)} of {len(gpus)} ranks reported: {seen}"
        return [s["reserved"] for s in seen]

    # earlier cells' cached blocks could serve the buffer without reserving more: free them
    session.run("import torch; torch.cuda.empty_cache()", len(gpus), out=io.StringIO())
    before = reserved()
    interrupt_running_loop(session, body, n=len(gpus))
    first = reserved()
    interrupt_running_loop(session, body, n=len(gpus))
    second = reserved()
    for rank, (b, f, s) in enumerate(zip(before, first, second)):
        assert f >= b + 512 * MIB, f"rank {rank}: the loop's 512 MiB buffer was not on the GPU ({b // MIB} MiB " \
                                   f"reserved before it, {f // MIB} MiB after)"
        assert s <= f + 64 * MIB, f"rank {rank}: GPU memory grew from {f // MIB} to {s // MIB} MiB"


def test_the_preflight_shows_the_real_gpu_driver_and_cuda(session, gpus):
    """The table names each engine's GPU by its UUID's first characters (reservations
    are matched by UUID), with the driver and CUDA that nvidia-smi and torch report."""
    text = session.check(len(gpus)).text()
    uuid, driver = nvidia_smi("uuid", "driver_version")[0]
    assert uuid[:12] in text and driver in text and torch.version.cuda in text, text


def test_the_cluster_panel_reads_the_real_nvidia_smi():
    """What the panel parses from nvidia-smi agrees with CUDA's own answers: each GPU
    torch sees is there by UUID with CUDA's name for it, and 1 GiB this process
    allocates on GPU 0 shows in its used memory (at least 0.9 GiB more: nvidia-smi counts
    MiB, and other processes may hold or free some)."""
    from pdl_lab.resources import gpu_stats

    by_uuid = {s["uuid"]: s for s in gpu_stats()}
    uuids = [f"GPU-{torch.cuda.get_device_properties(i).uuid}" for i in range(torch.cuda.device_count())]
    for i, uuid in enumerate(uuids):
        assert uuid in by_uuid, (uuid, sorted(by_uuid))
        assert by_uuid[uuid]["name"] == torch.cuda.get_device_name(i), (by_uuid[uuid], torch.cuda.get_device_name(i))

    def used_now() -> int:
        """The panel's reading of GPU 0's used memory, in bytes."""
        return next(s for s in gpu_stats() if s["uuid"] == uuids[0])["mem_used_bytes"]

    torch.cuda.empty_cache()  # else the allocation may come from this process's cached blocks
    torch.cuda.synchronize(0)
    used_before = used_now()
    block = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
    try:
        block.fill_(1)
        torch.cuda.synchronize(0)
        used_after = used_now()
    finally:
        del block
        torch.cuda.empty_cache()
    assert used_after - used_before >= 0.9 * GIB, f"used {used_before // MIB} MiB, then {used_after // MIB} MiB"


def test_horovod_all_reduces_with_nccl(horovod, session, gpus):
    cell = """
import json, torch
t = hvd.allreduce(torch.full((1024,), float(rank + 1), device=device), op=hvd.Sum)
print(json.dumps({"sum": t[0].item(), "size": hvd.size(), "device": str(t.device)}))
"""
    seen = run_json(session, cell, len(gpus), backend="horovod")
    n = len(gpus)
    assert len(seen) == n and all(s == {"sum": n * (n + 1) / 2, "size": n, "device": "cuda:0"} for s in seen), seen


def test_fit_trains_with_horovods_optimizer_on_the_gpu(horovod, session, gpus):
    """``fit`` in a ``--backend horovod`` cell (bf16, channels_last, not compiled): it
    steps ``hvd.DistributedOptimizer`` over a world of every rank, the loss falls from
    the first epoch to the second, the test accuracy ends above chance (85 % on a CPU),
    and the replicas end with the same weights."""
    seen = fit_on_every_gpu(session, gpus, "horovod", epochs=2, batch_size=32, width=32, bf16=True,
                            channels_last=True, compile=False)
    for s in seen:
        _, optimizer = s["made"][0]
        assert optimizer.startswith("horovod.torch.optimizer."), s  # hvd.DistributedOptimizer's class
        assert s["losses"][1] < s["losses"][0], s
        assert s["test_acc"] > 1 / len(CLASSES), s  # above chance


@pytest.fixture
def hub(tmp_path):
    """A hub whose pool is what nvidia-smi reports (no PDL_POOL)."""
    from hub_harness import hub_fixture

    yield from hub_fixture(tmp_path, ["gpuadmin"], pool=[])


def test_a_real_hub_gives_a_user_an_engine_on_every_gpu(hub, gpus):
    """The local spawner's pool comes from nvidia-smi (no PDL_POOL): a user asking for
    every GPU gets one engine on each, in an NCCL group, through the hub and its proxy."""
    from hub_harness import Kernel

    kernel = None
    try:
        r = hub.spawn("gpuadmin", len(gpus))
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("gpuadmin")
        kernel = Kernel(hub, "gpuadmin")
        kernel.execute_ok("%load_ext pdl_magics")
        cell = (f"%%distributed -n {len(gpus)} --all-output\nimport json, os, torch, torch.distributed as dist\n"
                "t = torch.ones(1, device=device); dist.all_reduce(t)\n"
                "print(json.dumps({'slot': os.environ['PDL_SLOT'], 'backend': dist.get_backend(), "
                "'sum': t.item()}))")
        out = kernel.execute_ok(cell, timeout=300)
        seen = [json.loads(m) for m in re.findall(r"\{.*\}", out["stdout"])]
        assert sorted(s["slot"] for s in seen) == sorted(gpus), out
        assert all(s["backend"] == "nccl" and s["sum"] == len(gpus) for s in seen), seen
    finally:
        if kernel is not None:
            kernel.close()
