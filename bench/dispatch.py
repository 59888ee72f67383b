"""Dispatch overhead: an empty ``%%distributed`` cell vs ipyparallel's ``%%px``, same engines.

    .venv/bin/python bench/dispatch.py [-n 2] [--cells 200] [--warmup 20]

Starts a local PDL cluster (``-n`` engines over this machine's GPUs, or CPU
slots) and an IPython ``InteractiveShell`` with ``%load_ext pdl_magics``; the
first ``%%distributed -n N`` cell starts the engines and forms the process group
(not timed). ipyparallel's own magics are then activated on a blocking view of
exactly the engines of that world, so both magics run on the same processes.

Each timed sample is the wall time of one ``shell.run_cell`` of a cell whose
body is ``pass``, as the user's cell runs it: the magic is parsed, the cell is
sent, every engine runs it, and the magic returns once all ranks are done and
their output is in. After ``--warmup`` untimed cells of each, ``--cells``
cells of each are timed, the two magics alternating (which goes first flips
every round) so that load changes hit both alike. Output is captured, not
printed. Prints a table of p50 and p99 latency (ms) and the ratios
``%%distributed`` / ``%%px`` of the p50s and p99s (target: both <= 1.25).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import time

from _common import local_slots

#: The ratio %%distributed / %%px that p50 and p99 should stay within.
TARGET = 1.25


def main(argv=None) -> float:
    """Run the benchmark; return the larger of the p50 and p99 ratios %%distributed / %%px."""
    args = _parse(argv)
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from pdl_magics import DistributedSession

    pool = local_slots(args.n)
    session = DistributedSession(local_slots=pool)
    DistributedSession._default = session  # the session %%distributed runs on
    config = Config()
    config.HistoryManager.enabled = False  # keep the benchmark's cells out of the user's history
    shell = InteractiveShell.instance(config=config)
    shell.run_line_magic("load_ext", "pdl_magics")
    cells = {"%%distributed": f"%%distributed -n {args.n}\npass\n", "%%px": "%%px\npass\n"}
    times: dict[str, list[float]] = {name: [] for name in cells}
    try:
        _run_cell(shell, cells["%%distributed"])  # engines up, process group formed
        view = session.client[[r.engine_id for r in session.last_world]]
        view.block = True
        view.activate()  # %%px on exactly the ranks of %%distributed
        engines = view.targets
        for _ in range(args.warmup):
            for cell in cells.values():
                _run_cell(shell, cell)
        for i in range(args.cells):
            order = list(cells.items()) if i % 2 == 0 else list(cells.items())[::-1]
            for name, cell in order:
                times[name].append(_run_cell(shell, cell))
    finally:
        session.close()

    _header(args, pool, engines)
    print("| magic | p50 (ms) | p99 (ms) | mean (ms) | min (ms) |")
    print("|---|---:|---:|---:|---:|")
    stats = {}
    for name, samples in times.items():
        stats[name] = (_percentile(samples, 50), _percentile(samples, 99))
        print(f"| `{name}` | {stats[name][0]:.2f} | {stats[name][1]:.2f} | "
              f"{statistics.fmean(samples):.2f} | {min(samples):.2f} |")
    p50 = stats["%%distributed"][0] / stats["%%px"][0]
    p99 = stats["%%distributed"][1] / stats["%%px"][1]
    print(f"\nratio %%distributed / %%px: p50 {p50:.2f}, p99 {p99:.2f} (target: both <= {TARGET})")
    return max(p50, p99)


def _run_cell(shell, cell: str) -> float:
    """Run ``cell`` in ``shell`` with its output captured; return its wall time in ms.

    Raises RuntimeError (with the captured output) if the cell failed.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        started = time.perf_counter()
        result = shell.run_cell(cell, store_history=True)
        elapsed = time.perf_counter() - started
    if not result.success:
        raise RuntimeError(f"cell {cell.splitlines()[0]!r} failed:\n{out.getvalue()}{err.getvalue()}")
    return 1000 * elapsed


def _percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``samples``, linearly interpolated."""
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _header(args, slots: list[str], engines) -> None:
    import ipyparallel
    import IPython
    import torch

    print(
        f"\n{args.n} engines {engines} on slots {', '.join(slots)} ({os.cpu_count()} cores, "
        f"{platform.processor() or platform.machine()}), empty cell (`pass`), {args.cells} timed cells "
        f"of each after {args.warmup}, alternating; Python {platform.python_version()}, "
        f"IPython {IPython.__version__}, ipyparallel {ipyparallel.__version__}, torch {torch.__version__}\n"
    )


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2, help="ranks (engines); default 2")
    p.add_argument("--cells", type=int, default=200, help="timed cells of each magic; default 200")
    p.add_argument("--warmup", type=int, default=20, help="untimed cells of each first; default 20")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(0 if main() > 0 else 1)
