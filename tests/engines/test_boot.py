"""The engine process's setup (pdl.runtime.boot): malloc keeps freed memory, so a
training step does not page-fault in fresh zeroed pages every step."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc's thresholds are glibc's")

#: Twenty steps of a small CNN on batches of 124 images of 3x16x16 (a few MiB of
#: activations each), after ten to warm up; prints the page faults of those twenty.
STEPS = """
import resource, sys, torch
from pdl.runtime import boot
print(boot.keep_freed_memory())
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4096, 3, 16, 16), torch.randn(4096, 1)
for step in range(30):
    if step == 10:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    idx = torch.randint(0, 4096, (124,))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
    opt.step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_of_twenty_steps(**env) -> tuple[bool, int]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", STEPS], env={**environ, **env}, capture_output=True,
                          text=True, timeout=120, check=True)
    applied, faults = done.stdout.split()
    return applied == "True", int(faults)


def test_an_engines_training_steps_reuse_their_memory():
    applied, faults = faults_of_twenty_steps()
    assert applied
    assert faults < 2048, f"{faults} page faults in 20 steps (8 MiB of fresh pages)"


def test_the_admins_malloc_settings_are_kept():
    applied, faults = faults_of_twenty_steps(MALLOC_TRIM_THRESHOLD_="0", MALLOC_MMAP_THRESHOLD_="65536")
    assert not applied
    assert faults > 2048, "with the admin's (here wasteful) thresholds, the steps fault in fresh pages"
