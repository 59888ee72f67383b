"""Cells the fault tests run, the same on local engines, under the hub and on the swarm."""

from __future__ import annotations

#: All-reduces for up to 120 s; rank 0 prints "loop running" once it is under way
#: (the moment a test injects its fault).
ALL_REDUCE_LOOP = """
import time, torch, torch.distributed as dist
steps, stop_at = 0, time.time() + 120
while time.time() < stop_at:
    dist.all_reduce(torch.ones(1000))
    steps += 1
    if steps == 20 and rank == 0:
        print("loop running", flush=True)
"""

#: Prints "sum N" on rank 0 after an all-reduce of ones: the world works again.
SUM = "import torch, torch.distributed as dist\nt = torch.ones(1); dist.all_reduce(t); print('sum', int(t.item()))"


def magic(code: str, n: int, options: str = "") -> str:
    """``code`` as a ``%%distributed -n n`` cell."""
    return f"%%distributed -n {n}{' ' + options if options else ''}\n{code.lstrip()}"
