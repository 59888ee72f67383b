"""The steps of ``scripts/gpu-check``, run by it in the environment it installed offline.

    python scripts/gpu_check.py OUT [--steps A,B] [--cpu-only]   # --cpu-only: no GPU, on purpose

Each step runs in its own process with a time limit (seconds, below), writes
``OUT/<step>.log`` and gives one result: passed, failed or skipped, with a figure. A
step stopped by its limit says "timed out after N s" with its last log line (the last
lines are printed too); the test steps run pytest verbosely, so each test's result is
in the log as it finishes, and a stopped step still counts those. A test that skipped
counts as skipped, never as passed. ``OUT/summary.md`` gets the table of every step,
the machine it ran on and whether torch.compile can run there; the same is printed
(``OUT/run.json``: the command and when; ``scripts/gpu_publish.py OUT`` puts both into
docs/benchmarks.md). Steps that need a CUDA GPU are skipped without one, and the
summary says why in one line. Exit status: 1 when a step failed; else 3 when no CUDA
GPU was seen and ``--cpu-only`` was not given (a GPU check that checked no GPU has not
passed); else 0.

Steps: the bundle's install (``OUT/install.json``, from ``scripts/gpu-check``);
``%%distributed`` outside the hub (a DDP cell on every slot of this machine: its GPUs,
or CPU slots); ``pytest -m gpu`` (tests/engines/test_gpu.py); the training throughput
benchmark on CINIC-10-sized data made in memory (GPU only); the time to 97 % test
accuracy on real images (bench/time_to_accuracy.py on the digits, GPU only); Horovod
built with NCCL and its GPU test (GPU only; skipped with one line naming all the build
lacks where a tool is missing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))  # its sibling scripts, when loaded from elsewhere
from nccl_of_torch import wheel_nccl  # noqa: E402 - after its folder is on the path
#: Each step's time limit, seconds: with the install's 60 (scripts/gpu-check), at most
#: :data:`WORST_CASE_S` in all. Measured on an H200 (docs/benchmarks.md): 19, 50 to 96,
#: 93 (then writing PNGs), 23 and 106 (building Horovod with an empty cache).
LIMITS_S = {"distributed": 45, "gpu-tests": 150, "throughput": 90, "time-to-accuracy": 50, "horovod": 200}
#: The longest a whole check may take, install included: 10 minutes.
WORST_CASE_S = 600
#: Training images of the throughput benchmark: CINIC-10's 90,000 (9,000 a class).
BENCH_PER_CLASS = 9000

DISTRIBUTED_CELL = r"""
import math, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(rank)
model = torch.nn.Linear(64, 1).to(device)
ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
w = torch.arange(64.0, device=device)[:, None] / 64
for step in range(50):
    x = torch.randn(128, 64, device=device)
    loss = ((ddp(x) - x @ w) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
print(f"rank {rank}/{world_size} backend {dist.get_backend()} device {device} loss {loss.item():.5f} "
      f"finite {math.isfinite(loss.item())}")
"""
DISTRIBUTED_SCRIPT = f"""
import pdl_magics
print("pdl_magics from", pdl_magics.__file__, flush=True)
from pdl.slots import default_pool
from pdl_magics import DistributedSession
pool = default_pool()
session = DistributedSession(local_slots=pool)
try:
    result = session.run({DISTRIBUTED_CELL!r}, len(pool), all_output=True)
finally:
    session.close()
"""


@dataclass
class Result:
    status: str  # passed, failed, skipped
    figure: str
    seconds: float = 0.0


#: Exit status when no CUDA GPU was seen and the caller did not ask for a CPU-only run.
NO_GPU_EXIT = 3
#: Lines of a stopped step's log that are printed.
LAST_LINES = 5
#: pytest -v's line for one finished test: its id and outcome.
TEST_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", re.M)


def run_logged(out: Path, step: str, cmd: list[str], cwd: Path = REPO) -> tuple[int | None, str]:
    """Run ``cmd`` in ``cwd`` with the step's time limit, output to ``OUT/<step>.log``;
    (exit status or None when it ran out of time, the output)."""
    log = out / f"{step}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=LIMITS_S[step])
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # the step's own process group: engines it started go with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text(errors="replace")
    if rc is None:
        with open(log, "a") as f:
            f.write(f"\n[gpu-check: stopped after the step's limit of {LIMITS_S[step]} s]\n")
    return rc, text


def timed_out(step: str, text: str) -> Result:
    """A step stopped by its limit: "timed out after N s" and the log's last line (the
    last :data:`LAST_LINES` are printed)."""
    lines = [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    print(f"gpu-check: {step} timed out after {LIMITS_S[step]} s; its log ended with:", *lines[-LAST_LINES:],
          sep="\n  ", flush=True)
    last = lines[-1][:120] if lines else "(nothing logged)"
    return Result("failed", f"timed out after {LIMITS_S[step]} s; last: {last}")


def pytest_counts(xml: Path, text: str) -> dict[str, int]:
    """passed, failed (failures and errors) and skipped tests of a pytest run: from its
    JUnit XML when it finished, else from its verbose log's lines (a run stopped midway)."""
    if xml.exists():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
                "failed": n["failures"] + n["errors"], "skipped": n["skipped"]}
    outcomes = dict(TEST_OUTCOME.findall(text))  # a test's last line wins (an ERROR in teardown)
    return {"passed": sum(o in ("PASSED", "XFAIL") for o in outcomes.values()),
            "failed": sum(o in ("FAILED", "ERROR", "XPASS") for o in outcomes.values()),
            "skipped": sum(o == "SKIPPED" for o in outcomes.values())}


def pytest_result(step: str, rc: int | None, xml: Path, text: str) -> Result:
    """The result of a step that ran pytest: failed when a test failed, the run did not
    finish (timed out, with the tests done so far) or pytest itself failed; skipped when
    every test skipped (or none ran); else passed."""
    counts = pytest_counts(xml, text)
    figure = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    if rc is None:
        timed_out(step, text)  # prints the log's last lines
        return Result("failed", f"timed out after {LIMITS_S[step]} s ({figure} by then)")
    if counts["failed"] or rc not in (0, 5) or not xml.exists():
        return Result("failed", figure if xml.exists() else f"pytest exited with {rc}: see {step}.log")
    return Result("passed" if counts["passed"] else "skipped", figure)


def pytest_cmd(xml: Path, *args: str) -> list[str]:
    """pytest on the GPU tests, verbose (a line per finished test), results also to
    ``xml`` (removed first: a stopped run must not leave an earlier run's)."""
    xml.unlink(missing_ok=True)
    return [sys.executable, "-m", "pytest", "-m", "gpu", "tests/engines/test_gpu.py", "-p", "no:cacheprovider",
            "-v", "-rs", f"--junitxml={xml}", *args]


def no_gpu_reason() -> str | None:
    """Why the GPU steps cannot run here (None: a CUDA GPU is there)."""
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def step_install(out: Path) -> Result:
    info = json.loads((out / "install.json").read_text())
    return Result("passed", f"offline in {info['seconds']} s, torch from {info['torch_site']}")


def step_distributed(out: Path) -> Result:
    # outside the checkout: PDL as the bundle installed it, not the source tree
    rc, text = run_logged(out, "distributed", [sys.executable, "-c", DISTRIBUTED_SCRIPT], cwd=out)
    ranks = re.findall(r"rank (\d+)/(\d+) backend (\S+) device (\S+) loss (\S+) finite (\S+)", text)
    if rc != 0 or not ranks or len(ranks) != int(ranks[0][1]) or any(r[5] != "True" for r in ranks):
        return Result("failed", "see distributed.log") if rc is not None else timed_out("distributed", text)
    world, backend = ranks[0][1], ranks[0][2]
    devices = sorted({r[3].split(":")[0] for r in ranks})
    return Result("passed", f"{world} ranks, {backend} on {'/'.join(devices)}, DDP loss "
                            f"{max(float(r[4]) for r in ranks):.4f}")


def step_gpu_tests(out: Path) -> Result:
    xml = out / "gpu-tests.xml"
    rc, text = run_logged(out, "gpu-tests", pytest_cmd(xml))
    return pytest_result("gpu-tests", rc, xml, text)


def step_throughput(out: Path) -> Result:
    workers = str(min(8, os.cpu_count() or 2))
    rc, text = run_logged(out, "throughput", [sys.executable, "bench/train_throughput.py", "--per-class",
                                              str(BENCH_PER_CLASS), "--epochs", "3", "--workers", workers,
                                              "--in-memory"])
    ratio = re.search(r"ratio .*: ([\d.]+)", text)
    pdl = re.search(r"\| PDL[^|]*\| (\d+) \|", text)
    if rc != 0 or not ratio:
        return Result("failed", "see throughput.log") if rc is not None else timed_out("throughput", text)
    per_epoch = 90000 / float(pdl.group(1)) if pdl else None
    figure = f"PDL / pytorch-cifar {ratio.group(1)}x"
    if per_epoch:
        figure += f"; {pdl.group(1)} img/s, {per_epoch:.1f} s an epoch of 90,000, 15 epochs ~{15 * per_epoch / 60:.1f} min"
    return Result("passed", figure)


def step_time_to_accuracy(out: Path) -> Result:
    """bench/time_to_accuracy.py on the real digits (pdl_cinic10.digits) on every GPU:
    the seconds PDL's two rows took to 97 % test accuracy (the peer's row, bound by PIL
    on the CPU, took 100 s of an H100 machine's time: left out)."""
    rc, text = run_logged(out, "time-to-accuracy", [sys.executable, "bench/time_to_accuracy.py",
                                                    "--targets", "0.97", "--skip-peer"])
    # table rows: | recipe | network | time to 97% | best accuracy | total |
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| PDL,")]
    if rc != 0 or len(rows) != 2:
        return Result("failed", "see time-to-accuracy.log") if rc is not None \
            else timed_out("time-to-accuracy", text)
    parts = [f"{recipe.split(':')[0]} ({network}): {when}" for recipe, network, when, *_ in rows]
    return Result("passed", "97 % on real digits: " + "; ".join(parts))


def nvcc_release(nvcc: str) -> str:
    """The CUDA release ``nvcc --version`` reports ("13.0"), or "?"."""
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    found = re.search(r"release (\d+\.\d+)", text)
    return found.group(1) if found else "?"


def nccl_home() -> Path | None:
    """A folder whose ``include/nccl.h`` Horovod's build can use: ``$HOROVOD_NCCL_HOME``,
    ``$NCCL_HOME``, the CUDA toolkit's (``$CUDA_HOME``, nvcc's, ``/usr/local/cuda``), the
    system's (``/usr/local``, ``/usr``), or the one torch's CUDA wheels bring (the
    ``nvidia-nccl`` package, :func:`nccl_of_torch.wheel_nccl`); None when there is none."""
    nvcc = shutil.which("nvcc")
    folders = [os.environ.get("HOROVOD_NCCL_HOME"), os.environ.get("NCCL_HOME"), os.environ.get("CUDA_HOME"),
               str(Path(nvcc).resolve().parent.parent) if nvcc else None, "/usr/local/cuda", "/usr/local", "/usr"]
    found = next((Path(f) for f in folders if f and (Path(f) / "include" / "nccl.h").is_file()), None)
    return found or wheel_nccl()


def horovod_build_problem() -> str | None:
    """None when this machine has what building Horovod with NCCL needs; else one line
    naming everything it lacks: a C++ compiler, make (or ninja), cmake, Python.h, a CUDA
    build of torch, nvcc of torch's CUDA major version, NCCL (scripts/gpu-check installs
    cmake and ninja from the bundle first)."""
    import torch
    from pdl_cinic10.compile_support import python_header

    lacks = []
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")):
        lacks.append("a C++ compiler (g++)")
    if not (shutil.which("make") or shutil.which("ninja")):  # scripts/build-horovod takes ninja without make
        lacks.append("make or ninja")
    if not shutil.which("cmake"):
        lacks.append("cmake")
    if python_header() is None:
        lacks.append("Python.h (python3-dev)")
    cuda = torch.version.cuda
    nvcc = shutil.which("nvcc")
    if cuda is None:
        lacks.append(f"a CUDA build of torch (torch {torch.__version__} has none)")
    elif nvcc is None:
        lacks.append(f"nvcc (CUDA {cuda}'s compiler)")
    elif (release := nvcc_release(nvcc)).split(".")[0] != cuda.split(".")[0]:
        lacks.append(f"an nvcc of CUDA {cuda.split('.')[0]} (torch's CUDA {cuda}; {nvcc} is CUDA {release})")
    if nccl_home() is None:
        lacks.append("NCCL (torch's nvidia-nccl wheel or /usr/include/nccl.h)")
    return f"cannot build Horovod with NCCL here: this machine lacks {', '.join(lacks)}" if lacks else None


def step_horovod(out: Path) -> Result:
    """Build Horovod with NCCL (scripts/build-horovod), then its GPU test: passed only
    when that test ran and passed (a skipped test is a skipped step, with the reason)."""
    problem = horovod_build_problem()
    if problem:
        return Result("skipped", problem)
    xml = out / "horovod-tests.xml"
    test = shlex.join(pytest_cmd(xml, "-k", "horovod"))
    rc, text = run_logged(out, "horovod", ["bash", "-c", f"HOROVOD_GPU_OPERATIONS=NCCL scripts/build-horovod "
                                                         f"{sys.executable} && echo 'gpu-check: built' && {test}"])
    if "gpu-check: built" not in text:
        return Result("failed", "the build failed: see horovod.log") if rc is not None else timed_out("horovod", text)
    built = re.search(r"build-horovod: (built|installed) horovod (\S+)", text)
    version = f"horovod {built.group(2) if built else '?'} with NCCL"
    result = pytest_result("horovod", rc, xml, text)
    if result.status == "skipped":
        reason = re.search(r"^SKIPPED \[\d+\] \S+: (.*)$", text, re.M)
        return Result("skipped", f"{version} built; its GPU test skipped: {reason.group(1) if reason else '?'}")
    return Result(result.status, f"{version}; GPU test {result.status} ({result.figure})")


def compile_finding() -> str:
    """"ready" when torch.compile has what it needs on a GPU here, else "off: " and what is
    missing (pdl_cinic10.compile_support; the recipe then trains uncompiled)."""
    from pdl_cinic10.compile_support import compile_problem

    problem = compile_problem()
    return f"off: {problem}" if problem else "ready (a C compiler, Python.h and triton)"


def machine() -> str:
    import torch

    line = f"Python {sys.version.split()[0]}, torch {torch.__version__}"
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        line += f", CUDA {torch.version.cuda}, {names}"
        smi = shutil.which("nvidia-smi")
        if smi:
            driver = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=10).stdout.split()
            line += f", driver {driver[0] if driver else '?'}"
    return line


STEPS = [("install", "bundle installed offline", step_install, False),
         ("distributed", "%%distributed outside the hub", step_distributed, False),
         ("gpu-tests", "pytest -m gpu", step_gpu_tests, False),
         ("throughput", "training throughput, CINIC-10 size", step_throughput, True),
         ("time-to-accuracy", "time to 97 % on real images", step_time_to_accuracy, True),
         ("horovod", "Horovod with NCCL", step_horovod, True)]


def main(argv: list[str]) -> int:
    names = [name for name, *_ in STEPS]
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py")
    parser.add_argument("out", type=Path, help="folder for the logs and summary.md")
    parser.add_argument("--cpu-only", action="store_true",
                        help=f"a run without a GPU on purpose: exit 0 rather than {NO_GPU_EXIT} when no GPU is seen")
    parser.add_argument("--steps", default=",".join(names),
                        help=f"comma-separated steps to run, of: {', '.join(names)} (default: all)")
    args = parser.parse_args(argv)
    chosen = args.steps.split(",")
    unknown = [s for s in chosen if s not in names]
    if unknown:
        parser.error(f"unknown step {unknown[0]!r}; valid steps: {', '.join(names)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # how and when this ran, for scripts/gpu_publish.py
    command = ["bash scripts/gpu-check", f"{args.out.name}/"]
    command += ["--steps", args.steps] if args.steps != ",".join(names) else []
    command += ["--cpu-only"] if args.cpu_only else []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (out / "run.json").write_text(json.dumps({"command": " ".join(command), "started": started}) + "\n")
    reason = no_gpu_reason()
    rows = []
    for name, title, fn, needs_gpu in STEPS:
        if name not in chosen:
            continue
        started = time.monotonic()
        if needs_gpu and reason:
            result = Result("skipped", "no CUDA GPU")
        else:
            try:
                result = fn(out)
            except Exception as e:  # noqa: BLE001 - one step's bug must not hide the others
                result = Result("failed", f"{type(e).__name__}: {e}".splitlines()[0])
        result.seconds = time.monotonic() - started
        rows.append((title, result))
        print(f"gpu-check: {title}: {result.status} ({result.figure}) in {result.seconds:.0f} s", flush=True)
    lines = [f"Machine: {machine()}", "", f"torch.compile: {compile_finding()}", ""]
    if reason:
        lines += [f"GPU steps skipped: {reason}.", ""]
    lines += ["| step | result | figure | seconds |", "|---|---|---|---:|"]
    lines += [f"| {title} | {r.status} | {r.figure} | {r.seconds:.0f} |" for title, r in rows]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if any(r.status == "failed" for _, r in rows):
        return 1
    if reason and not args.cpu_only:
        print(f"gpu-check: no CUDA GPU was checked ({reason}); exit {NO_GPU_EXIT} (--cpu-only runs without one "
              "on purpose)", file=sys.stderr)
        return NO_GPU_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
