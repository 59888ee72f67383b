"""Helpers shared by the benchmarks in ``bench/``."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def local_slots(n: int) -> list[str]:
    """The slots a local PDL cluster of ``n`` engines uses: this machine's first ``n``
    GPUs, or ``n`` CPU slots when it has fewer GPUs than that.

    The list is the session's whole pool, so its length fixes each engine's share
    of the cores (:func:`pdl.slots.engine_env`).
    """
    from pdl.slots import default_pool

    pool = default_pool()
    return pool[:n] if len(pool) >= n else [f"cpu:{i}" for i in range(n)]


def real_images_root(given: str | None = None) -> Path:
    """The real images a benchmark trains on: ``given``, else ``$CINIC10_DIR``, else
    scikit-learn's handwritten digits in CINIC-10's layout (:mod:`pdl_cinic10.digits`),
    written once under ``~/.cache/pdl/bench/digits``."""
    if given or os.environ.get("CINIC10_DIR"):
        return Path(given or os.environ["CINIC10_DIR"]).expanduser()
    from pdl_cinic10.digits import write_digits

    root = Path.home() / ".cache" / "pdl" / "bench" / "digits"
    if not (root / "test").is_dir():
        write_digits(root)
    return root


def run_script(script: str, what: str, env: dict[str, str] | None = None):
    """Run the Python ``script`` in a process of its own (this repository on its path;
    ``env`` added to this environment) and return the JSON it prints on a line starting
    ``RESULT ``. RuntimeError naming ``what`` and the script's last error line if it
    fails or prints none."""
    import json
    import subprocess
    import sys

    repo = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"the {what} run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(line[len("RESULT "):])


def machine() -> str:
    """One line: cores, processor, load average, and the torch / ipyparallel versions."""
    import ipyparallel
    import torch

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), load avg {load}; "
        f"python {platform.python_version()}, torch {torch.__version__}, ipyparallel {ipyparallel.__version__}"
    )



def median_table(header: tuple[str, str], labels: dict[str, str], runs: dict[str, list[float]],
                 ratio: str, digits: int = 2) -> float:
    """Print a markdown table of each entry's median, min and max (whole numbers), then
    the line ``ratio <ratio>: <first median / second median>``; return that ratio.

    ``header`` names the first column and the median column (e.g. ``("recipe", "img/s
    (median)")``); ``labels`` and ``runs`` share their two keys, the measured entry
    first and its peer second; ``digits`` is the ratio's decimals.
    """
    import statistics

    print(f"| {header[0]} | {header[1]} | min | max |")
    print("|---|---:|---:|---:|")
    medians = {}
    for key, label in labels.items():
        medians[key] = statistics.median(runs[key])
        print(f"| {label} | {medians[key]:.0f} | {min(runs[key]):.0f} | {max(runs[key]):.0f} |")
    first, second = (medians[key] for key in labels)
    print(f"\nratio {ratio}: {first / second:.{digits}f}")
    return first / second


def simulation(name: str, script: str):
    """The tests' harness module ``name`` (``tests/harness/<name>.py``, the one place
    that makes simulated nodes and CPU quotas), once its ``problem()`` says it can run
    here; else SystemExit naming ``script`` and why (one line)."""
    import importlib
    import sys

    folder = str(Path(__file__).resolve().parent.parent / "tests" / "harness")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.import_module(name)
    problem = module.problem()
    if problem:
        raise SystemExit(f"{script}: {problem}")
    return module


def positive_numbers(text: str) -> list[float]:
    """``text`` as comma-separated numbers > 0 (an argparse ``type``: a bad value is the
    one-line usage error ``argparse.ArgumentTypeError`` makes)."""
    import argparse

    try:
        numbers = [float(x) for x in text.split(",")]
    except ValueError:
        numbers = []
    if not numbers or not all(x > 0 for x in numbers):
        raise argparse.ArgumentTypeError(f"comma-separated numbers > 0 are valid, got {text!r}")
    return numbers
