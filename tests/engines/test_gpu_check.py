"""The offline GPU kit on a machine without a GPU, as CI runs it.

``scripts/gpu-bundle`` builds the bundle for this machine's Python (under 60 MiB, no
torch in it); a fresh "GPU machine" environment gets only torch, numpy, Pillow and
scikit-learn (the packages the bundle assumes, which CUDA images carry); ``scripts/gpu-check`` then installs PDL from the bundle
with no package index, runs ``%%distributed`` from that install on CPU engines, runs
the ``gpu`` tests (which skip), skips the GPU-only steps, and says why in one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
#: Python's own interpreter of this checkout's .venv (the GPU machine's stand-in).
BASE_PYTHON = os.path.realpath(sys.executable)


def run(*cmd, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{cmd[:2]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-bundle") / "bundle"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    done = run("bash", "scripts/gpu-bundle", "--python", version, "--out", str(out))
    assert re.search(rf"gpu-bundle: {re.escape(str(out))} for Python {version}: \d+ files, \d+ MiB", done.stdout)
    return out


def test_the_bundle_is_under_60_mib_and_carries_no_torch(bundle):
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size < 60 * 1024 * 1024, f"{size / 2**20:.1f} MiB"
    names = [f.name.lower() for f in (bundle / "wheels").iterdir()]
    assert not [n for n in names if n.startswith(("torch-", "jupyterlab-", "numpy-", "pillow-", "scikit_learn-", "scipy-"))], names
    assert [n for n in names if n.startswith("pdl-0")] and [n for n in names if n.startswith("horovod-")]
    assert (bundle / "assumed.txt").read_text().split() == ["torch>=2.4", "numpy>=1.26", "pillow>=10.0",
                                                            "scikit-learn>=1.3"]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The "GPU machine": its own torch (this machine's, from pip's configured source),
    numpy, Pillow and scikit-learn, and nothing of PDL."""
    venv = tmp_path_factory.mktemp("gpu-machine") / "venv"
    run(BASE_PYTHON, "-m", "venv", str(venv))
    run(str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", "constraints.txt", "torch", "numpy",
        "pillow", "scikit-learn")
    return venv


def test_the_check_installs_offline_runs_distributed_and_skips_the_gpu_steps(bundle, target, tmp_path):
    out = tmp_path / "results"
    # an index pip would use if the check let it: nothing answers there
    done = subprocess.run(["bash", "scripts/gpu-check", str(out), "--bundle", str(bundle), "--python",
                           str(target / "bin" / "python")], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/unreachable"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    rows = {row[0]: row[1:] for row in (
        [c.strip() for c in line.strip("|").split("|")] for line in summary.splitlines() if line.startswith("| "))}
    assert rows["bundle installed offline"][0] == "passed"
    assert rows["%%distributed outside the hub"][0] == "passed"
    assert re.match(r"\d+ ranks, gloo on cpu, DDP loss", rows["%%distributed outside the hub"][1])
    assert rows["pytest -m gpu"][:2] == ["skipped", "0 passed, 0 failed, 10 skipped"]
    assert rows["training throughput, CINIC-10 size"][:2] == ["skipped", "no CUDA GPU"]
    assert rows["Horovod with NCCL"][:2] == ["skipped", "no CUDA GPU"]
    reasons = [line for line in summary.splitlines() if line.startswith("GPU steps skipped:")]
    assert reasons == [f"GPU steps skipped: torch {torch_version(target)} sees no CUDA GPU "
                       "(torch.cuda.is_available() is False)."]
    # %%distributed ran PDL as the bundle installed it in the check's own environment
    source = re.search(r"pdl_magics from (\S+)", (out / "distributed.log").read_text()).group(1)
    assert "/pdl-gpu-check." in source and not source.startswith(str(REPO)), source


def torch_version(venv: Path) -> str:
    return run(str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)").stdout.strip()


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
