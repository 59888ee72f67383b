"""``%%distributed`` in a real IPython shell, over a real local cluster of three engines."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from engines_harness import strip_ansi
from pdl.slots import default_pool
from pdl_magics import DistributedSession, DistributedUsageError
from pdl_magics.magics import DistributedMagics

pytestmark = pytest.mark.integration

AVAILABLE = 3  # engines in pdl_session


@pytest.fixture(scope="module")
def ip(pdl_session):
    shell = InteractiveShell.instance()
    shell.register_magics(DistributedMagics(shell, session=pdl_session))
    return shell


@pytest.fixture(scope="module")
def marker(tmp_path_factory):
    """A file every rank appends its rank to when the cell runs; must stay absent."""
    return tmp_path_factory.mktemp("marker") / "ran"


def marker_cell(path) -> str:
    return f"with open({str(path)!r}, 'a') as f:\n    f.write(f'{{rank}}\\n')\n"


def assert_usage_error_and_nothing_ran(ip, marker, line, *fragments):
    marker.unlink(missing_ok=True)
    try:
        with pytest.raises(UsageError) as info:
            ip.run_cell_magic("distributed", line, marker_cell(marker))
        message = str(info.value)
        assert "\n" not in message, f"not one line: {message!r}"
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} not in {message!r}"
        assert not marker.exists(), f"{line!r} ran the cell on ranks {marker.read_text().split()}"
    finally:
        marker.unlink(missing_ok=True)


def test_default_n_runs_on_every_engine_and_prints_rank0_output(ip, marker):
    with capture_output() as cap:
        ip.run_cell_magic("distributed", "", marker_cell(marker) + "print(f'rank {rank} of {world_size}')")
    try:
        assert sorted(marker.read_text().split()) == ["0", "1", "2"]
    finally:
        marker.unlink(missing_ok=True)
    assert cap.stdout == "rank 0 of 3\n"


def test_cell_magic_streams_rank0_and_keeps_the_others(ip):
    cell = "import torch, torch.distributed as dist\nprint(f'hello from rank {rank} of {world_size}')\n"
    with capture_output() as cap:
        result = ip.run_cell_magic("distributed", "-n 2", cell)
    assert result is None
    assert "hello from rank 0 of 2" in cap.stdout
    assert "rank 1" not in cap.stdout + cap.stderr

    with capture_output() as cap:
        ip.run_line_magic("distributed", "--output 1")
    assert f"--- rank 1 ({socket.gethostname()}) ---" in cap.stdout
    assert "hello from rank 1 of 2" in cap.stdout
    assert "rank 0" not in cap.stdout

    # --all-output prints every other rank after rank 0; a last expression is shown too
    with capture_output() as cap:
        ip.run_cell_magic(
            "distributed",
            "-n 2 --all-output",
            cell + "t = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nprint(f'sum {t.item()} on {rank}')\nt.item() * 10",
        )
    out = cap.stdout
    assert "hello from rank 0 of 2" in out and "sum 3.0 on 0" in out and "30.0" in out
    assert out.index("sum 3.0 on 0") < out.index("--- rank 1") < out.index("sum 3.0 on 1")


def test_a_failing_rank_is_shown_with_its_rank_host_and_traceback(ip):
    with capture_output() as cap:
        result = ip.run_cell("%%distributed -n 2\nx = 1\nif rank == 1:\n    raise ValueError('bad shard')\n")
    assert result.error_in_exec is not None and result.error_in_exec.rank == 1
    shown = strip_ansi(cap.stdout + cap.stderr)
    assert f"Rank 1 on host {socket.gethostname()} raised ValueError:" in shown
    assert "raise ValueError('bad shard')" in shown and "ValueError: bad shard" in shown
    assert "pdl_magics" not in shown  # no frames of PDL itself


def test_usage_errors_show_as_one_line_in_the_shell(ip, marker):
    with capture_output() as cap:
        result = ip.run_cell(f"%%distributed -n 0\n{marker_cell(marker)}")
    assert isinstance(result.error_in_exec, UsageError)
    shown = (cap.stdout + cap.stderr).strip()
    assert shown.startswith("UsageError:") and "1..3" in shown
    assert len(shown.splitlines()) == 1, shown
    assert not marker.exists()


@pytest.mark.parametrize(
    "line, fragments",
    [
        ("-n 0", ["-n 0", "1..3"]),
        ("-n 99", ["-n 99", "1..3"]),
        ("-n -2", ["-n -2", "1..3"]),
        ("-n abc", ["'abc'", "-n N"]),
        ("-n", ["-n", "-n N"]),
        ("-n 2 --foo", ["--foo", "-n N, --backend {torch|horovod}"]),
        ("-n 2 extra", ["extra", "-n N, --backend {torch|horovod}"]),
        ("-n 2 --backend mpi", ["'mpi'", "torch, horovod"]),
        ("-n 2 --backend", ["--backend", "{torch|horovod}"]),
        ("-n 2 --timeout -1", ["--timeout", "> 0"]),
        ("-n 2 --timeout 0", ["--timeout", "> 0"]),
        ("-n 2 --timeout soon", ["'soon'", "--timeout SECONDS"]),
        ("-n 2 --timeout nan", ["--timeout", "> 0"]),
        ("-n 2 --hang-timeout -1", ["--hang-timeout", ">= 0"]),
        ("-n 2 --hang-timeout inf", ["--hang-timeout", ">= 0"]),
        ("-n 2 --hang-timeout later", ["'later'", "--hang-timeout SECONDS"]),
        ("-n 2 --output 1", ["--output", "line magic"]),
        ("-n 2 --backend 'mpi", ["torch"]),  # unbalanced quote
    ],
)
def test_bad_arguments_are_a_one_line_usage_error_and_run_nothing(ip, marker, line, fragments):
    assert_usage_error_and_nothing_ran(ip, marker, line, *fragments)


def test_balance_and_no_balance_set_every_ranks_mode_for_the_cell_only(ip):
    cell = "from pdl.balance.plan import current_mode\nprint(f'mode {current_mode()}')"
    for line, mode in (("-n 3 --balance", "on"), ("-n 3 --no-balance", "off"), ("-n 3", "auto")):
        with capture_output() as cap:
            ip.run_cell_magic("distributed", line + " --all-output", cell)
        assert strip_ansi(cap.stdout).count(f"mode {mode}") == 3, cap.stdout


def test_pdl_balance_sets_the_mode_of_cells_without_a_flag_and_a_bad_one_is_one_line(pdl_session, marker,
                                                                                   monkeypatch):
    cell = "from pdl.balance.plan import current_mode\nprint(f'mode {current_mode()}')"
    shell = InteractiveShell.instance()
    monkeypatch.setenv("PDL_BALANCE", "off")  # e.g. in the spawner's environment, for reproducible runs
    magics = DistributedMagics(shell, session=pdl_session)
    shell.register_magics(magics)
    try:
        for line, mode in (("-n 3", "off"), ("-n 3 --balance", "on")):
            with capture_output() as cap:
                shell.run_cell_magic("distributed", line + " --all-output", cell)
            assert strip_ansi(cap.stdout).count(f"mode {mode}") == 3, cap.stdout
        monkeypatch.setenv("PDL_BALANCE", "sometimes")
        shell.register_magics(DistributedMagics(shell, session=pdl_session))
        assert_usage_error_and_nothing_ran(shell, marker, "-n 2",
                                           "balance (or $PDL_BALANCE) must be one of auto, on, off, got 'sometimes'")
    finally:
        monkeypatch.delenv("PDL_BALANCE")
        shell.register_magics(DistributedMagics(shell, session=pdl_session))


def test_a_bad_balance_mode_through_the_python_api_is_one_line_naming_the_modes(pdl_session, marker):
    with pytest.raises(DistributedUsageError, match=r"^balance must be one of auto, on, off, got 'yes'$"):
        pdl_session.run(marker_cell(marker), 2, balance="yes")
    assert not marker.exists()


def test_horovod_backend_without_horovod_is_a_one_line_usage_error(ip, marker, monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod", None)  # as if it were not installed
    assert_usage_error_and_nothing_ran(
        ip, marker, "-n 2 --backend horovod", "--backend horovod needs Horovod", "scripts/setup --horovod"
    )


def test_line_magic_needs_output_and_a_rank_of_the_last_cell(ip):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("distributed", "-n 2")
    assert "--output RANK" in str(info.value) and "\n" not in str(info.value)

    with capture_output():
        ip.run_cell_magic("distributed", "-n 2", "print(rank)")
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("distributed", "--output 7")
    assert str(info.value) == "no output kept for rank 7; ranks of the last cell: 0, 1"


def test_load_ext_registers_distributed_as_cell_and_line_magic(ip, pdl_session, monkeypatch):
    monkeypatch.delenv("PDL_CLUSTER_FILE", raising=False)
    monkeypatch.delenv("PDL_SLOTS", raising=False)
    monkeypatch.setattr(DistributedSession, "_default", None)
    ip.extension_manager.loaded.discard("pdl_magics")
    try:
        ip.run_line_magic("load_ext", "pdl_magics")
        magics = ip.magics_manager.magics
        assert "distributed" in magics["cell"] and "distributed" in magics["line"]
        registered = magics["cell"]["distributed"].__self__
        assert isinstance(registered, DistributedMagics)

        # it is wired to the process-wide default session, which validates
        # against this machine's pool without starting anything
        pool = len(default_pool())
        with pytest.raises(UsageError, match=rf"use -n 1\.\.{pool}$"):
            ip.run_cell_magic("distributed", f"-n {pool + 1}", "print(rank)")
        assert registered.session is DistributedSession.default()
        assert DistributedSession.default().client is None
    finally:
        ip.extension_manager.loaded.discard("pdl_magics")
        ip.register_magics(DistributedMagics(ip, session=pdl_session))


def _valid_n(text: str) -> bool:
    try:
        return text.isascii() and 1 <= int(text) <= AVAILABLE
    except ValueError:
        return False


# what a user can type on the magic's line: anything but line breaks and control
# characters, with the characters a command line treats specially drawn often
line_text = st.text(
    alphabet=st.one_of(
        st.sampled_from("-=.,'\" \\0123456789n"),
        st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")),
    ),
    max_size=20,
)
fuzz = settings(
    max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@fuzz
@given(n=st.one_of(st.integers(max_value=0), st.integers(min_value=AVAILABLE + 1)))
def test_fuzz_n_out_of_range(ip, marker, n):
    assert_usage_error_and_nothing_ran(ip, marker, f"-n {n}", f"-n {n}", f"1..{AVAILABLE}")


@fuzz
@given(text=line_text.filter(lambda t: t.strip() and not _valid_n(t.split()[0])))
def test_fuzz_n_text(ip, marker, text):
    assert_usage_error_and_nothing_ran(ip, marker, f"-n {text}")


@fuzz
@given(text=line_text.filter(lambda t: "torch" not in t and "horovod" not in t and "--o" not in t and "--t" not in t))
def test_fuzz_backend(ip, marker, text):
    assert_usage_error_and_nothing_ran(ip, marker, f"-n 2 --backend {text}", "torch")


def _number(text: str) -> bool:
    """What the magic takes as a number: ASCII only (so "３" must be refused)."""
    try:
        float(text)
    except ValueError:
        return False
    return text.isascii() and "_" not in text


# values a user (or a pasted snippet) could put where a number belongs: Python, shell
# and format-string code, and the fuzzed line text
code_text = st.one_of(
    st.sampled_from([
        "__import__('os').system('touch /tmp/pdl-pwned')",
        "$(touch /tmp/pdl-pwned)",
        "`id`",
        "{rank}",
        "'; import os; os._exit(1) #",
        "exec('print(1)')",
        "lambda: 1",
        "1;2",
        "３",  # a full-width digit
        "٣",  # an Arabic-Indic digit
        "2\u00a0",
    ]),
    line_text,
).filter(lambda t: t.strip() and not _number(t.split()[0]))


@fuzz
@given(option=st.sampled_from(["-n", "--timeout", "--hang-timeout", "--backend"]), text=code_text)
def test_fuzz_code_in_option_values_runs_nothing(ip, marker, option, text):
    line = f"-n 2 {option} {text}" if option != "-n" else f"-n {text}"
    if option == "--backend" and text.split()[0].strip("'\"") in ("torch", "horovod"):
        return
    assert_usage_error_and_nothing_ran(ip, marker, line)
    assert not os.path.exists("/tmp/pdl-pwned")


SCALE_SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
net = torch.nn.parallel.DistributedDataParallel(model)
xs, ys = torch.randn(32, 32), torch.randint(0, 10, (32,))
def step():
    return torch.nn.functional.cross_entropy(net(xs), ys)
step().backward()  # a gradient the user holds, which measuring must leave as it was
before = ({k: v.clone() for k, v in model.state_dict().items()}, [p.grad.clone() for p in model.parameters()])
"""


def test_pdl_scale_predicts_the_step_for_more_nodes_from_what_the_engines_measured(ip):
    with capture_output():
        ip.run_cell_magic("distributed", "-n 3", SCALE_SETUP)
    with capture_output() as cap:
        ip.run_line_magic("pdl", "scale --loss step --model net --batch 32 -n 3")
    text = strip_ansi(cap.stdout)
    params = 32 * 64 + 64 + 64 * 2 + 64 * 10 + 10
    assert f"gradient {params * 4 / 2**20:.1f} MiB, 32 images a rank" in text, text
    assert "your engines are on one node: no link to measure" in text
    assert "CPU-s a second over many passes" in text  # CPU engines: what their CPU work bounds
    assert "forward_s" not in text  # the ranks' raw measurements are not shown
    with capture_output() as cap:
        ip.run_cell_magic("distributed", "-n 3 --all-output", (
            "print('kept', all(torch.equal(v, model.state_dict()[k]) for k, v in before[0].items()) "
            "and all(torch.equal(g, p.grad) for g, p in zip(before[1], model.parameters())))"))
    assert cap.stdout.count("kept True") == 3, cap.stdout  # weights, BatchNorm statistics, gradients
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["1"], ["100"])]
    assert {(r[0], r[2]) for r in rows} == {(g, str(n)) for g in ("1", "100") for n in (1, 2, 4, 8, 16, 32)}
    one_node = [r for r in rows if r[2] == "1"]
    assert all(float(r[5]) == 1.0 and r[6] == "compute" for r in one_node)  # efficiency 1.00 on one node


@pytest.mark.parametrize("line, fragment", [
    ("scale --model net --batch 8", "%pdl scale needs --loss"),
    ("scale --loss step --model 'net; import os' --batch 8", "--model must name a variable"),
    ("scale --loss step --model net --batch 0", "--batch must be the images of one rank's step"),
    ("scale --loss step --model net --batch 8 --backend horovod", "measures with torch.distributed"),
    ("check --batch 8", "--batch are for %pdl scale"),
])
def test_pdl_scale_refuses_bad_arguments_in_one_line(ip, line, fragment):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("pdl", line)
    assert fragment in str(info.value) and "\n" not in str(info.value)
