"""Every benchmark in bench/ runs as documented and prints its table and ratio.

Tiny sizes: this checks that the benchmarks work on a fresh setup, not the
figures (those are in docs/benchmarks.md, with the commands that made them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

TABLE_ROW = re.compile(r"^\|.*\|\s*$", re.M)


def run_bench(tmp_path, script: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("CINIC10_DIR", None)
    done = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def ratio(out: str, label: str) -> float:
    match = re.search(rf"^ratio {re.escape(label)}.*?: (\d+\.\d+)", out, re.M)
    assert match, f"no '{label}' ratio line in:\n{out}"
    return float(match.group(1))


@pytest.mark.timeout(300)
def test_data_pipeline_bench_prints_both_pipelines_and_the_ratio(tmp_path):
    out = run_bench(tmp_path, "data_pipeline.py", "--per-class", "60", "--epochs", "1", "--batch", "64")
    rows = TABLE_ROW.findall(out)
    assert any("PDL" in r for r in rows) and any("ImageFolder" in r for r in rows), out
    assert ratio(out, "PDL / ImageFolder") > 0
    assert re.search(r"PDL cache: built once in [\d.]+ s", out)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("in_memory", [(), ("--in-memory",)], ids=["png-folder", "in-memory"])
def test_train_throughput_bench_prints_both_recipes_and_the_ratio(tmp_path, in_memory):
    out = run_bench(tmp_path, "train_throughput.py", "--per-class", "20", "--epochs", "2", "--width", "4", *in_memory)
    rows = TABLE_ROW.findall(out)
    assert any("PDL" in r for r in rows) and any("pytorch-cifar" in r for r in rows), out
    assert ratio(out, "PDL / pytorch-cifar") > 0
    assert ("200 train images (the synthetic sample, in memory)" in out) == bool(in_memory), out


@pytest.mark.timeout(600)
def test_time_to_accuracy_bench_runs_three_rows_on_real_images(tmp_path):
    """The default data is the real digits set; the peer runs in its own process, PDL's two
    rows in cells; target 0 stops each after one epoch."""
    out = run_bench(tmp_path, "time_to_accuracy.py", "-n", "1", "--peer-epochs", "1", "--peer-width", "4",
                    "--targets", "0.0", timeout=600)
    rows = TABLE_ROW.findall(out)
    assert any("pytorch-cifar, seed's settings" in r and "width 4" in r for r in rows), out
    assert any("PDL, same network" in r and "width 4" in r for r in rows), out
    assert any("PDL, its own choice" in r and "width 16" in r for r in rows), out
    assert "data " + str(tmp_path / ".cache/pdl/bench/digits") in out, out
    assert ratio(out, "pytorch-cifar / PDL own choice") > 0
    assert ratio(out, "pytorch-cifar / PDL same network") > 0


@pytest.mark.timeout(300)
def test_dispatch_bench_compares_distributed_with_px_on_the_same_engines(tmp_path):
    out = run_bench(tmp_path, "dispatch.py", "-n", "2", "--cells", "10", "--warmup", "3")
    rows = TABLE_ROW.findall(out)
    assert any("%%distributed" in r for r in rows) and any("%%px" in r for r in rows), out
    assert re.search(r"p50 \d+\.\d+, p99 \d+\.\d+", out), out


@pytest.mark.timeout(300)
def test_engine_start_bench_compares_warm_engines_with_ipyparallels_cold_ones(tmp_path):
    out = run_bench(tmp_path, "engine_start.py", "-n", "2", "--rounds", "1")
    rows = TABLE_ROW.findall(out)
    assert any(r.startswith("| warm |") for r in rows) and any(r.startswith("| cold |") for r in rows), out
    assert re.search(r"CPU-s per engine start \d+\.\dx", out), out


@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="the bench's hub gives its user a Unix account: needs root")
def test_spawn_to_output_bench_drives_both_trees_through_a_browser(tmp_path):
    out = run_bench(tmp_path, "spawn_to_output.py", "--rounds", "1", timeout=540)
    rows = TABLE_ROW.findall(out)
    assert any(r.startswith("| this tree |") for r in rows) and any(r.startswith("| peer 109cffc |") for r in rows), out
    assert re.search(r"^peer / this tree: spawn → Lab \d+\.\d\dx, .* idle return \d+\.\d\dx$", out, re.M), out


@pytest.mark.timeout(400)
def test_scaling_bench_runs_the_same_script_on_pdl_and_torchrun(tmp_path):
    out = run_bench(tmp_path, "scaling.py", "--max-n", "2", "--batch", "8", "--width", "4", "--steps", "2",
                    "--warmup", "1", "--repeats", "1", timeout=400)
    rows = TABLE_ROW.findall(out)
    assert any(r.startswith("| 1 |") for r in rows) and any(r.startswith("| 2 |") for r in rows), out
    assert ratio(out, "E_pdl(2) / E_torchrun(2)") > 0


@pytest.mark.timeout(300)
def test_allreduce_bench_compares_training_with_bare_all_reduce(tmp_path):
    out = run_bench(tmp_path, "allreduce.py", "-n", "2", "--batch", "8", "--width", "4", "--steps", "2",
                    "--warmup", "2", "--iters", "3")
    rows = TABLE_ROW.findall(out)
    assert any("training" in r for r in rows) and any("bare all_reduce" in r for r in rows), out
    assert ratio(out, "training busbw / bare busbw") > 0


@pytest.mark.timeout(300)
def test_recipe_sweep_prints_the_rule_s_choice_and_one_line_of_results(tmp_path):
    out = run_bench(tmp_path, "recipe_sweep.py", "world=2", "epochs=2", "width=4")
    assert re.search(r"^world=2 epochs=2 width=4 \| width 4, global batch 32, 2 epochs \| train loss \S+ \S+ "
                     r"\| test acc % \d+ \d+ \| 97 %: .* \| 98 %: .* \| total \d+ s$", out, re.M), out


@pytest.mark.timeout(120)
def test_compile_cost_bench_says_in_one_line_why_it_compares_nothing_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: scripts/gpu-check runs this benchmark in full")
    out = run_bench(tmp_path, "compile_cost.py")
    assert out.strip() == ("compile_cost: no CUDA GPU here; fit compiles only on a GPU, so there is nothing to "
                           "compare")


@pytest.mark.timeout(300)
def test_cpu_workers_bench_compares_workers_with_one_threaded_process(tmp_path):
    out = run_bench(tmp_path, "cpu_workers.py", "-n", "2", "--epochs", "1", "--repeats", "1")
    rows = TABLE_ROW.findall(out)
    assert any("PDL: 2 workers" in r for r in rows) and any("one process, 2 threads" in r for r in rows), out
    assert ratio(out, "PDL 2 workers / one process 2 threads") > 0


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="CPU quotas need root")
def test_mixed_workers_bench_runs_the_notebook_even_and_balanced_on_unequal_quotas(tmp_path):
    out = run_bench(tmp_path, "mixed_workers.py", "--epochs", "1", "--width", "8")
    rows = TABLE_ROW.findall(out)
    assert [r.split("|")[1].strip() for r in rows[2:]] == ["equal", "even split", "balanced"], out
    assert "| even split | 0.60, 0.30, 0.15 | even |" in out, out
    assert ratio(out, "even split / balanced") > 0 and "accuracy balanced - equal:" in out


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need root")
def test_scale_prediction_bench_prints_predicted_and_measured_steps(tmp_path):
    out = run_bench(tmp_path, "scale_prediction.py", "--mbit", "200", "--steps", "2", "--width", "8", "--batch", "8")
    rows = TABLE_ROW.findall(out)
    assert len(rows) == 3 and rows[2].startswith("| 200 Mbit/s |"), out
    assert ratio(out, "predicted / measured step") > 0


@pytest.mark.parametrize("script,option", [("scale_prediction.py", "--mbit"), ("mixed_workers.py", "--quotas")])
def test_a_bad_list_of_numbers_is_one_line_naming_what_is_valid(tmp_path, script, option):
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "bench" / script), option, "50,fast"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"argument {option}: comma-separated numbers > 0 are valid, got '50,fast'"), done.stderr
    assert "Traceback" not in done.stderr
