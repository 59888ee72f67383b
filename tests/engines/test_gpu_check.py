"""The offline GPU kit on a machine without a GPU, as CI runs it.

``scripts/gpu-bundle`` builds the bundle for Python 3.12, the GPU machine's (with the
repository, 8 MiB under its 64 MiB copy limit; no torch in it). A fresh "GPU machine"
gets a Python 3.12 with torch as pip gives it there (a CUDA build, with NCCL and triton
wheels) and the packages the bundle assumes (numpy, Pillow, scikit-learn). In a network
namespace with no network, ``scripts/gpu-check --cpu-only`` installs PDL from the bundle,
runs ``%%distributed`` from that install on CPU engines, runs the ``gpu`` tests (which
skip), skips the GPU-only steps and says why in one line; its summary is checked. The
NCCL of torch's wheel is linked, loaded and found by Horovod's own CMake module, the
way scripts/build-horovod uses it. Without a Python 3.12 these skip, with the reason.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from gpu_machine import REPO, needs_python_312, run

# deadline: the check's steps have limits in seconds (scripts/gpu-check, scripts/gpu_check.py)
pytestmark = [pytest.mark.timeout(900), pytest.mark.deadline]

#: Python's own interpreter of this checkout's .venv (the GPU machine's stand-in).
BASE_PYTHON = os.path.realpath(sys.executable)


def load_gpu_check():
    """scripts/gpu_check.py as a module (it is a script, not a package)."""
    if "gpu_check" not in sys.modules:  # registered first: its dataclass looks itself up there
        spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
        sys.modules["gpu_check"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


def gpu_test_count() -> int:
    """How many tests ``pytest -m gpu`` has (each skips here)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # -v there would change the listing
    done = run(sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
               "tests/engines/test_gpu.py", env=env)
    return sum("::" in line for line in done.stdout.splitlines())


@pytest.mark.unit
def test_the_whole_check_takes_at_most_10_minutes_limits_included():
    check = load_gpu_check()
    script = (REPO / "scripts" / "gpu-check").read_text()
    install = sum(int(v) for v in re.findall(r"^(?:REQUIREMENTS|WHEEL|TOOLS)_LIMIT_S=(\d+)$", script, re.M))
    assert install == 60 and check.WORST_CASE_S == 600
    assert install + sum(check.LIMITS_S.values()) <= check.WORST_CASE_S, check.LIMITS_S


@pytest.mark.unit
def test_a_step_stopped_by_its_limit_says_so_with_its_last_line(tmp_path, monkeypatch, capsys):
    check = load_gpu_check()
    monkeypatch.setitem(check.LIMITS_S, "distributed", 1)
    rc, text = check.run_logged(tmp_path, "distributed", ["bash", "-c", "echo one; echo two; sleep 30"])
    assert rc is None
    assert check.timed_out("distributed", text).figure == "timed out after 1 s; last: two"
    assert "gpu-check: distributed timed out after 1 s; its log ended with:\n  one\n  two" in capsys.readouterr().out
    assert (tmp_path / "distributed.log").read_text().endswith("[gpu-check: stopped after the step's limit of 1 s]\n")


@pytest.mark.unit
def test_a_stopped_test_step_keeps_the_results_of_the_tests_that_finished(tmp_path):
    check = load_gpu_check()
    log = ("tests/engines/test_gpu.py::test_a PASSED                  [ 33%]\n"
           "tests/engines/test_gpu.py::test_b SKIPPED (needs a CUDA GPU) [ 66%]\n"
           "tests/engines/test_gpu.py::test_c ")
    result = check.pytest_result("gpu-tests", None, tmp_path / "none.xml", log)
    limit = check.LIMITS_S["gpu-tests"]
    assert (result.status, result.figure) == ("failed", f"timed out after {limit} s (1 passed, 0 failed, 1 skipped by then)")


@pytest.mark.unit
@pytest.mark.parametrize("tests, failures, skipped, rc, expected", [
    (1, 0, 1, 0, ("skipped", "0 passed, 0 failed, 1 skipped")),   # e.g. Horovod's test when Horovod is missing
    (3, 0, 1, 0, ("passed", "2 passed, 0 failed, 1 skipped")),
    (3, 1, 0, 1, ("failed", "2 passed, 1 failed, 0 skipped")),
    (0, 0, 0, 5, ("skipped", "0 passed, 0 failed, 0 skipped")),   # none collected
])
def test_a_skipped_test_is_never_counted_as_passed(tmp_path, tests, failures, skipped, rc, expected):
    check = load_gpu_check()
    xml = tmp_path / "r.xml"
    xml.write_text(f'<testsuites><testsuite tests="{tests}" failures="{failures}" errors="0" skipped="{skipped}"/>'
                   "</testsuites>")
    result = check.pytest_result("gpu-tests", rc, xml, "")
    assert (result.status, result.figure) == expected


#: The GPU machine's copy limit (repository and bundle), and what the bundle must leave of it.
COPY_LIMIT_MIB, HEADROOM_MIB = 64, 8


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-bundle") / "bundle"
    done = run("bash", "scripts/gpu-bundle", "--python", "3.12", "--out", str(out))
    assert re.search(rf"gpu-bundle: {re.escape(str(out))} for Python 3.12: \d+ files, \d+ MiB", done.stdout)
    return out


def tree_bytes() -> int:
    """The repository's files, as the GPU machine gets them (git's tracked files)."""
    names = run("git", "ls-files", "-z").stdout.split("\0")
    return sum((REPO / n).stat().st_size for n in names if n and (REPO / n).is_file())


@needs_python_312
@pytest.mark.integration
def test_the_bundle_leaves_8_mib_of_the_copy_limit_and_carries_no_torch(bundle):
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size + tree_bytes() <= (COPY_LIMIT_MIB - HEADROOM_MIB) * 2**20, (
        f"bundle {size / 2**20:.1f} MiB + repository {tree_bytes() / 2**20:.1f} MiB")
    names = [f.name.lower() for f in (bundle / "wheels").iterdir()]
    assert not [n for n in names if n.startswith(("torch-", "jupyterlab-", "numpy-", "pillow-", "scikit_learn-", "scipy-"))], names
    for wanted in ("pdl-0", "horovod-", "cmake-", "ninja-"):
        assert [n for n in names if n.startswith(wanted)], f"no {wanted}* in the bundle"
    assert (bundle / "assumed.txt").read_text().split() == ["torch>=2.4", "numpy>=1.26", "pillow>=10.0",
                                                            "scikit-learn>=1.3"]


#: What a browser loads from the hub's ``static/components`` for its pages (its page
#: template and style sheet name them): the slimmed jupyterhub wheel must keep them.
HUB_PAGE_ASSETS = ["bootstrap/dist/js/bootstrap.bundle.min.js", "jquery/dist/jquery.min.js", "requirejs/require.js",
                   "moment/moment.js", "@fortawesome/fontawesome-free/css/fontawesome.css",
                   "@fortawesome/fontawesome-free/css/solid.css",
                   "@fortawesome/fontawesome-free/webfonts/fa-solid-900.woff2"]


@needs_python_312
@pytest.mark.integration
def test_the_slimmed_hub_keeps_what_its_pages_load_and_not_font_awesomes_sources(bundle):
    wheel = zipfile.ZipFile(next((bundle / "wheels").glob("jupyterhub-*.whl")))
    components = {n.split("/static/components/", 1)[1] for n in wheel.namelist() if "/static/components/" in n}
    assert set(HUB_PAGE_ASSETS) <= components, set(HUB_PAGE_ASSETS) - components
    assert not [c for c in components if c.startswith("@fortawesome/fontawesome-free/svgs/")]
    assert any(n.endswith("/templates/page.html") for n in wheel.namelist())


def offline(*cmd: str) -> list[str]:
    """``cmd`` in a new network namespace with only its loopback up: no network at all."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "offline", *cmd]


@needs_python_312
@pytest.mark.integration
def test_the_check_installs_offline_runs_distributed_and_skips_the_gpu_steps(bundle, target, tmp_path):
    out = tmp_path / "results"
    done = subprocess.run(offline("bash", "scripts/gpu-check", str(out), "--bundle", str(bundle), "--python",
                                  str(target / "bin" / "python"), "--cpu-only"), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    rows = {row[0]: row[1:] for row in (
        [c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines() if line.startswith("| "))}
    assert summary.startswith(f"Machine: Python 3.12."), summary
    assert rows["bundle installed offline"][0] == "passed"
    assert rows["%%distributed outside the hub"][0] == "passed"
    assert re.match(r"\d+ ranks, gloo on cpu, DDP loss", rows["%%distributed outside the hub"][1])
    assert rows["pytest -m gpu"][:2] == ["skipped", f"0 passed, 0 failed, {gpu_test_count()} skipped"]
    assert rows["training throughput, CINIC-10 size"][:2] == ["skipped", "no CUDA GPU"]
    assert rows["time to 97 % on real images"][:2] == ["skipped", "no CUDA GPU"]
    assert rows["Horovod with NCCL"][:2] == ["skipped", "no CUDA GPU"]
    # torch.compile's needs, found up front: torch's CUDA wheels bring triton, this machine gcc and Python.h
    assert "\ntorch.compile: ready (a C compiler, Python.h and triton)\n" in summary, summary
    reasons = [line for line in summary.splitlines() if line.startswith("GPU steps skipped:")]
    assert reasons == [f"GPU steps skipped: torch {torch_version(target)} sees no CUDA GPU "
                       "(torch.cuda.is_available() is False)."]
    # %%distributed ran PDL as the bundle installed it in the check's own environment
    source = re.search(r"pdl_magics from (\S+)", (out / "distributed.log").read_text()).group(1)
    assert "/pdl-gpu-check." in source and not source.startswith(str(REPO)), source


def torch_version(venv: Path) -> str:
    return run(str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)").stdout.strip()


@needs_python_312
@pytest.mark.integration
def test_without_a_gpu_the_check_fails_unless_asked_for_a_cpu_only_run(bundle, target, tmp_path):
    """A GPU check that saw no GPU has not passed: exit 3 and one line, after the steps ran."""
    done = subprocess.run(["bash", "scripts/gpu-check", str(tmp_path / "results"), "--bundle", str(bundle),
                           "--python", str(target / "bin" / "python"), "--steps", "install"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpu-check: no CUDA GPU was checked (torch {torch_version(target)} sees no CUDA GPU "
        "(torch.cuda.is_available() is False)); exit 3 (--cpu-only runs without one on purpose)")
    assert "| bundle installed offline | passed |" in (tmp_path / "results" / "summary.md").read_text()


@needs_python_312
@pytest.mark.integration
def test_a_machine_without_what_the_bundle_assumes_is_told_in_one_line(bundle, target, tmp_path):
    """Guards the assumed-packages check in scripts/gpu-check: without it, the check
    would install and run without them, and fail later somewhere else."""
    lacking = tmp_path / "bundle"
    lacking.mkdir()
    for item in bundle.iterdir():
        (lacking / item.name).symlink_to(item)
    (lacking / "assumed.txt").unlink()
    (lacking / "assumed.txt").write_text((bundle / "assumed.txt").read_text() + "pdl-no-such-package>=1\n")
    done = subprocess.run(["bash", "scripts/gpu-check", str(tmp_path / "results"), "--bundle", str(lacking),
                           "--python", str(target / "bin" / "python")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("gpu-check: this machine lacks pdl-no-such-package, which the bundle assumes; make the bundle with "
            'scripts/gpu-bundle --assume "" to carry them') in done.stderr, done.stderr
    assert not (tmp_path / "results" / "summary.md").exists()


NCCL_PROBE = """#include <stdio.h>
int ncclGetVersion(int *version);
int main(void) { int v = 0; int r = ncclGetVersion(&v); printf("%d %d\\n", r, v); return r; }
"""


@needs_python_312
@pytest.mark.integration
def test_horovods_build_finds_links_and_loads_the_nccl_of_torchs_wheel(bundle, target, tmp_path):
    """The NCCL folder scripts/build-horovod makes from torch's wheel: the linker takes
    ``-lnccl`` from it and the program runs the wheel's library (of the header's
    version, no GPU needed); Horovod's own FindNCCL.cmake, run by the bundle's cmake,
    finds both the way its build does (HOROVOD_NCCL_HOME, HOROVOD_NCCL_LINK=SHARED)."""
    home = Path(run(str(target / "bin" / "python"), "scripts/nccl_of_torch.py", str(tmp_path / "nccl")).stdout.strip())
    code = re.search(r"#define NCCL_VERSION_CODE (\d+)", (home / "include" / "nccl.h").read_text()).group(1)
    (tmp_path / "probe.c").write_text(NCCL_PROBE)
    run("gcc", str(tmp_path / "probe.c"), "-L", str(home / "lib"), "-lnccl", "-o", str(tmp_path / "probe"))
    # at run time the library's own name (libnccl.so.2), in the wheel, as torch loads it
    wheel_lib = (home / "lib" / "libnccl.so").resolve().parent
    assert wheel_lib.parts[-3:-1] == ("nvidia", "nccl"), wheel_lib
    done = run(str(tmp_path / "probe"), env={**os.environ, "LD_LIBRARY_PATH": str(wheel_lib)})
    assert done.stdout.split() == ["0", code], done.stdout

    tools = tmp_path / "tools"
    run(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(bundle / "wheels"),
        "--target", str(tools), "cmake")
    modules = tmp_path / "modules"
    modules.mkdir()
    with tarfile.open(next((bundle / "wheels").glob("horovod-*.tar.gz"))) as sdist:
        find_nccl = next(m for m in sdist.getmembers() if m.name.endswith("/cmake/Modules/FindNCCL.cmake"))
        (modules / "FindNCCL.cmake").write_bytes(sdist.extractfile(find_nccl).read())
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(f'cmake_minimum_required(VERSION 3.13)\nproject(probe C)\n'
                                            f'list(APPEND CMAKE_MODULE_PATH "{modules}")\nfind_package(NCCL REQUIRED)\n')
    done = run(str(tools / "cmake" / "data" / "bin" / "cmake"), "-S", str(project), "-B", str(tmp_path / "build"),
               env={**os.environ, "HOROVOD_NCCL_HOME": str(home), "HOROVOD_NCCL_LINK": "SHARED"})
    assert f"Found NCCL (include: {home}/include, library: {home}/lib/libnccl.so)" in done.stdout, done.stdout
    assert f"NCCL_VERSION_CODE: {code}" in done.stdout, done.stdout


def load_publisher():
    spec = importlib.util.spec_from_file_location("gpu_publish", REPO / "scripts" / "gpu_publish.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
def test_one_command_puts_a_checks_summary_between_the_docs_markers(tmp_path):
    publisher = load_publisher()
    results = tmp_path / "results"
    results.mkdir()
    (results / "summary.md").write_text("Machine: an H200\n\n| step | result |\n|---|---|\n| x | passed |\n")
    (results / "run.json").write_text('{"command": "bash scripts/gpu-check results/", "started": "2026-11-26 04:20 UTC"}')
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nbefore\n{publisher.BEGIN}\nold figures\n{publisher.END}\nafter\n")
    done = subprocess.run([sys.executable, "scripts/gpu_publish.py", str(results), "--doc", str(doc)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert doc.read_text() == (
        f"# Benchmarks\n\nbefore\n{publisher.BEGIN}\nRun 2026-11-26 04:20 UTC:\n\n```bash\n"
        "bash scripts/gpu-check results/\n```\n\nMachine: an H200\n\n| step | result |\n|---|---|\n| x | passed |\n"
        f"{publisher.END}\nafter\n")


@pytest.mark.unit
def test_a_doc_without_the_markers_is_refused_in_one_line_and_left_alone(tmp_path):
    publisher = load_publisher()
    results = tmp_path / "results"
    results.mkdir()
    (results / "summary.md").write_text("Machine: an H200\n")
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    done = subprocess.run([sys.executable, "scripts/gpu_publish.py", str(results), "--doc", str(doc)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"gpu_publish: {doc} needs one {publisher.BEGIN!r} line")
    assert doc.read_text() == "# Benchmarks\n"


@pytest.mark.unit
def test_the_docs_hold_the_block_the_publisher_writes():
    publisher = load_publisher()
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert text.count(publisher.BEGIN) == 1 and text.count(publisher.END) == 1
    block = text.split(publisher.BEGIN)[1].split(publisher.END)[0]
    assert "| step | result | figure | seconds |" in block


def fake_tools(folder: Path, nvcc_release: str | None = None) -> Path:
    """Executables named as a GPU machine's build tools (each only exits 0; ``nvcc --version``
    says ``nvcc_release``)."""
    folder.mkdir()
    for tool in ("g++", "make", "cmake") + (("nvcc",) if nvcc_release else ()):
        script = folder / tool
        script.write_text("#!/bin/sh\n" + (f"echo 'Cuda compilation tools, release {nvcc_release}, V{nvcc_release}.1'\n"
                                           if tool == "nvcc" else "exit 0\n"))
        script.chmod(0o755)
    return folder


@pytest.fixture
def bare_build_env(monkeypatch):
    for var in ("CXX", "HOROVOD_NCCL_HOME", "NCCL_HOME", "CUDA_HOME"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.unit
def test_a_machine_without_horovods_build_tools_is_told_all_it_lacks_in_one_line(tmp_path, monkeypatch,
                                                                                 bare_build_env):
    import torch

    check = load_gpu_check()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check.nccl_home() is None, "this machine has NCCL: the test needs one without"
    assert check.horovod_build_problem() == (
        "cannot build Horovod with NCCL here: this machine lacks a C++ compiler (g++), make or ninja, cmake, "
        f"a CUDA build of torch (torch {torch.__version__} has none), NCCL (torch's nvidia-nccl wheel or "
        "/usr/include/nccl.h)")


@pytest.mark.unit
def test_an_nvcc_of_another_cuda_than_torchs_is_named_with_both_versions(tmp_path, monkeypatch, bare_build_env):
    import torch

    check = load_gpu_check()
    tools = fake_tools(tmp_path / "bin", nvcc_release="12.4")
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # the seam: torch's CUDA build
    nccl = tmp_path / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "include" / "nccl.h").write_text("/* NCCL */\n")
    monkeypatch.setenv("HOROVOD_NCCL_HOME", str(nccl))
    assert check.horovod_build_problem() == (
        "cannot build Horovod with NCCL here: this machine lacks an nvcc of CUDA 13 (torch's CUDA 13.0; "
        f"{tools / 'nvcc'} is CUDA 12.4)")
    (tools / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    assert check.horovod_build_problem() is None
