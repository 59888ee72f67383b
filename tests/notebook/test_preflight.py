"""The preflight (``%pdl check``, and automatically before a session's first cell).

Unit tests feed the pure checks hand-written probe answers. The integration tests
run the real probe and all-reduce on real local engines; the only thing made up
there is the planted fault, injected for real into one engine process (a
``horovod`` module of another version, an interface that does not exist) and
removed afterwards (for a route not there yet, a probe of the engine's that answers
"No route to host").
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import socket
import time

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from engines_harness import SLOTS, strip_ansi
from pdl.runtime import preflight as engine_side
from pdl_magics import DistributedSession, PreflightFailed
from pdl_magics import group as group_module
from pdl_magics.magics import DistributedMagics
from pdl_magics.preflight import (
    COLUMNS,
    PreflightReport,
    Problem,
    find_problems,
    render_html,
    skipped_checks,
    render_text,
    run_checks,
    table_rows,
)

HOST = socket.gethostname()

# -- the pure checks -------------------------------------------------------------------

UUIDS = {0: "GPU-0000aaaa-1111-2222-3333-444455556666", 1: "GPU-1111bbbb-1111-2222-3333-444455556666"}


def gpu_probe(host: str, **changes) -> dict:
    """What :func:`pdl.runtime.preflight.probe` answers on a healthy GPU slot (gpu:0 of ``host``)."""
    probe = {
        "host": host, "pid": 100, "slot": "gpu:0", "reserved_gpu": "0",
        "gpus_seen": [{"name": "NVIDIA H100 80GB HBM3", "uuid": UUIDS[0]}], "host_gpus": dict(UUIDS),
        "driver": "550.54.15", "cuda": "12.4", "nccl": "2.21.5", "torch": "2.5.1+cu124",
        "horovod": "0.28.1+pdl1",
        "iface": {"name": "eth0", "source": "NCCL_SOCKET_IFNAME", "missing": [], "down": []},
    }
    probe.update(changes)
    return probe


def lines(problems) -> list[str]:
    return [str(p) for p in problems]


@pytest.mark.unit
def test_agreeing_ranks_have_no_problem_and_a_full_row_each():
    probes = [gpu_probe(f"node{i}") for i in (1, 2, 3)]
    smoke = [{"busbw_gbs": 11.5, "value": 6.0, "expected": 6.0, "error": None}] * 3
    assert find_problems(probes, smoke) == []
    rows = table_rows(probes, smoke)
    assert [r["rank"] for r in rows] == ["0", "1", "2"] and [r["host"] for r in rows] == ["node1", "node2", "node3"]
    assert rows[0] == {
        "rank": "0", "host": "node1", "slot": "gpu:0", "GPU (reserved / seen)": "0 / GPU-0000aaaa…",
        "driver": "550.54.15", "CUDA": "12.4", "NCCL": "2.21.5", "torch": "2.5.1+cu124",
        "horovod": "0.28.1+pdl1", "interface": "eth0 (NCCL_SOCKET_IFNAME)", "all-reduce GB/s": "11.50",
        "status": "✓",
    }


@pytest.mark.unit
def test_the_odd_version_out_is_named_with_the_ranks_and_hosts_it_differs_from():
    probes = [gpu_probe("node1"), gpu_probe("node2", horovod="0.0.1"), gpu_probe("node3")]
    assert lines(find_problems(probes)) == [
        "rank 1 on node2: horovod 0.0.1 differs from 0.28.1+pdl1 on ranks 0, 2 (node1, node3)"
    ]
    # an absent component is named as such, in either direction
    probes = [gpu_probe("node1"), gpu_probe("node2", horovod=None), gpu_probe("node3", driver="535.1")]
    assert lines(find_problems(probes)) == [
        "rank 1 on node2: horovod (not installed) differs from 0.28.1+pdl1 on ranks 0, 2 (node1, node3)",
        "rank 2 on node3: driver 535.1 differs from 550.54.15 on ranks 0, 1 (node1, node2)",
    ]


@pytest.mark.unit
def test_a_tie_is_decided_by_the_lowest_rank():
    two = [gpu_probe("a", torch="2.5.1"), gpu_probe("b", torch="2.4.0")]
    assert lines(find_problems(two)) == ["rank 1 on b: torch 2.4.0 differs from 2.5.1 on rank 0 (a)"]
    four = [gpu_probe(h, cuda=c) for h, c in (("a", "12.4"), ("b", "12.1"), ("c", "12.4"), ("d", "12.1"))]
    assert [p.rank for p in find_problems(four)] == [1, 3]
    three_ways = [gpu_probe(h, cuda=c) for h, c in (("a", "12.1"), ("b", "12.4"), ("c", "11.8"))]
    assert lines(find_problems(three_ways)) == [
        "rank 1 on b: CUDA 12.4 differs from 12.1 on rank 0 (a)",
        "rank 2 on c: CUDA 11.8 differs from 12.1 on rank 0 (a)",
    ]


@pytest.mark.unit
@pytest.mark.parametrize("changes, reason", [
    ({"gpus_seen": []}, "reserved GPU 0 but torch sees none"),
    ({"gpus_seen": [{"name": "H100", "uuid": UUIDS[0]}, {"name": "H100", "uuid": UUIDS[1]}]},
     f"reserved GPU 0 but torch sees 2 GPUs: {UUIDS[0]}, {UUIDS[1]}"),
    # CUDA_VISIBLE_DEVICES=1 but torch sees nvidia-smi's GPU 0 (CUDA numbers GPUs its own way)
    ({"reserved_gpu": "1", "slot": "gpu:1"}, f"reserved GPU 1 ({UUIDS[1]}) but torch sees {UUIDS[0]}"),
    ({"reserved_gpu": UUIDS[1], "host_gpus": {}}, f"reserved GPU {UUIDS[1]} but torch sees {UUIDS[0]}"),
    ({"slot": "cpu:0", "reserved_gpu": ""}, f"CPU slot cpu:0 but torch sees 1 GPU(s): {UUIDS[0]}"),
    ({"slot": "", "reserved_gpu": ""}, f"no GPU reserved but torch sees 1 GPU(s): {UUIDS[0]}"),
    # a MIG slot is a GPU slot: its engine must see its MIG device
    ({"slot": "mig:1", "reserved_gpu": "MIG-cba663e8", "gpus_seen": []}, "reserved GPU MIG-cba663e8 but torch sees none"),
])
def test_the_gpu_torch_sees_must_be_the_reserved_one(changes, reason):
    probes = [gpu_probe("node1"), gpu_probe("node2", **changes)]
    assert lines(find_problems(probes)) == [f"rank 1 on node2: {reason}"]


@pytest.mark.unit
def test_gpu_checks_pass_where_the_reservation_is_met_or_unknown():
    assert find_problems([gpu_probe("n", reserved_gpu=UUIDS[0], host_gpus={})]) == []
    assert find_problems([gpu_probe("n", slot="", reserved_gpu=None)]) == []  # not started by PDL
    cpu = gpu_probe("n", slot="cpu:1", reserved_gpu="", gpus_seen=[], driver=None, cuda=None, nccl=None)
    assert find_problems([cpu]) == []


@pytest.mark.unit
def test_an_admin_can_turn_checks_off_by_name():
    blind = gpu_probe("node2", gpus_seen=[], horovod="0.0.1")  # a simulated GPU, an odd Horovod
    probes = [gpu_probe("node1"), gpu_probe("node3"), blind]
    assert len(find_problems(probes, skip=set())) == 2
    assert lines(find_problems(probes, skip={"gpu"})) == [
        "rank 2 on node2: horovod 0.0.1 differs from 0.28.1+pdl1 on ranks 0, 1 (node1, node3)"]
    assert find_problems(probes, skip={"gpu", "versions"}) == []
    assert skipped_checks({"PDL_PREFLIGHT_SKIP": " gpu, allreduce"}) == {"gpu", "allreduce"}
    with pytest.raises(ValueError, match="unknown check.*gpus; valid: gpu, versions, interface, allreduce"):
        skipped_checks({"PDL_PREFLIGHT_SKIP": "gpus"})


@pytest.mark.unit
def test_a_missing_or_down_interface_and_a_failed_all_reduce_are_named():
    probes = [
        gpu_probe("node1"),
        gpu_probe("node2", iface={"name": "bogus0", "source": "GLOO_SOCKET_IFNAME", "missing": ["bogus0"],
                                  "down": []}),
        gpu_probe("node3", iface={"name": "eth1", "source": "address 10.0.0.7", "missing": [], "down": ["eth1"]}),
    ]
    assert lines(find_problems(probes)) == [
        "rank 1 on node2: interface bogus0 (GLOO_SOCKET_IFNAME) does not exist",
        "rank 2 on node3: interface eth1 (address 10.0.0.7) is down",
    ]
    ok = [gpu_probe("node1"), gpu_probe("node2")]
    smoke = [{"busbw_gbs": 1.0, "value": 3.0, "expected": 3.0, "error": None},
             {"busbw_gbs": 1.0, "value": 2.0, "expected": 3.0, "error": None}]
    assert lines(find_problems(ok, smoke)) == ["rank 1 on node2: all-reduce returned 2, expected 3"]
    hung = [{"host": "node1", "error": "all-reduce did not finish within 30 s"}, smoke[0]]
    problems = find_problems(ok, hung)
    assert lines(problems) == ["rank 0 on node1: all-reduce did not finish within 30 s"]
    assert [r["all-reduce GB/s"] for r in table_rows(ok, hung, problems)] == ["failed", "1.00"]
    assert [r["status"] for r in table_rows(ok, hung, problems)] == ["✗", "✓"]


@pytest.mark.unit
def test_a_rank_that_gave_no_answer_is_named_and_left_out_of_the_comparison():
    probes = [gpu_probe("node1"), {"host": "node2", "error": "did not answer the probe within 60 s"},
              gpu_probe("node3", torch="2.4.0")]
    # rank 2 ties with rank 0 alone: rank 0's value is taken as right
    assert lines(find_problems(probes)) == [
        "rank 1 on node2: did not answer the probe within 60 s",
        "rank 2 on node3: torch 2.4.0 differs from 2.5.1+cu124 on rank 0 (node1)",
    ]
    assert table_rows(probes)[1]["torch"] == "-"


@pytest.mark.unit
def test_text_and_html_tables_have_every_column_and_the_problems():
    probes = [gpu_probe("node1"), gpu_probe("<node2>", horovod="0.0.1"), gpu_probe("node3")]
    problems = find_problems(probes)
    rows = table_rows(probes, None, problems)
    text = render_text(rows, problems)
    header, rule, *body = text.splitlines()
    assert header.split() == " ".join(COLUMNS).split()
    assert set(rule) == {"-", " "}
    assert [line.split()[0] for line in body[:3]] == ["0", "1", "2"]
    assert body[1].endswith("✗") and body[0].endswith("✓")
    assert body[3] == str(problems[0])
    page = render_html(rows, problems)
    assert page.count("<tr>") == 4 and "&lt;node2&gt;" in page and "<node2>" not in page
    assert "horovod 0.0.1 differs" in page


@pytest.mark.unit
def test_preflight_failed_renders_one_line_per_problem_and_no_traceback():
    report = PreflightReport([gpu_probe("a"), gpu_probe("b")], problems=[
        Problem(0, "a", "interface bogus0 (GLOO_SOCKET_IFNAME) does not exist"),
        Problem(1, "b", "reserved GPU 0 but torch sees none"),
    ])
    with pytest.raises(PreflightFailed) as info:
        report.raise_if_failed("The cell did not run.")
    error = info.value
    assert str(error).splitlines() == [
        "rank 0 on a: interface bogus0 (GLOO_SOCKET_IFNAME) does not exist",
        "rank 1 on b: reserved GPU 0 but torch sees none",
    ]
    assert error._render_traceback_() == ["Preflight failed (2 problems):", *str(error).splitlines(),
                                          "The cell did not run."]
    PreflightReport([gpu_probe("a")]).raise_if_failed()  # nothing found: no error


# -- the engine side, in this process --------------------------------------------------


@pytest.mark.unit
def test_the_collective_interface_comes_from_the_variable_or_the_address(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert engine_side.collective_iface(False, "127.0.0.1") == {
        "name": "lo", "source": "address 127.0.0.1", "missing": [], "down": []}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "bogus0")
    assert engine_side.collective_iface(False, "127.0.0.1")["missing"] == ["bogus0"]
    # NCCL's forms: a prefix, an exact name, an exclusion
    for spec, missing in (("l", []), ("=l", ["l"]), ("=lo", []), ("bogus", ["bogus"]), ("^lo", [])):
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", spec)
        found = engine_side.collective_iface(True, "127.0.0.1")
        assert (found["source"], found["missing"]) == ("NCCL_SOCKET_IFNAME", missing), spec


@pytest.mark.unit
def test_the_probe_reads_versions_from_the_running_process(monkeypatch):
    import sys
    import types

    import torch

    found = engine_side.probe()
    assert found["torch"] == torch.__version__ and found["cuda"] == torch.version.cuda
    fake = types.ModuleType("horovod")
    fake.__version__ = "0.0.1"
    monkeypatch.setitem(sys.modules, "horovod", fake)
    assert engine_side.probe()["horovod"] == "0.0.1"
    monkeypatch.setitem(sys.modules, "horovod", None)  # as if it were not installed
    assert engine_side.probe()["horovod"] is None


# -- real engines ------------------------------------------------------------------------

PLANT = {
    # rank 1 imports a horovod of another version
    "horovod": (
        """
import sys, types
_pdl_saved = sys.modules.get('horovod')
_pdl_fake = types.ModuleType('horovod')
_pdl_fake.__version__ = '0.0.1'
sys.modules['horovod'] = _pdl_fake
""",
        """
import sys
if _pdl_saved is None:
    sys.modules.pop('horovod', None)
else:
    sys.modules['horovod'] = _pdl_saved
""",
    ),
    # rank 2's collectives are told to use an interface this host does not have
    "iface": (
        """
import os
_pdl_saved = os.environ.get('GLOO_SOCKET_IFNAME')
os.environ['GLOO_SOCKET_IFNAME'] = 'bogus0'
""",
        """
import os
if _pdl_saved is None:
    os.environ.pop('GLOO_SOCKET_IFNAME', None)
else:
    os.environ['GLOO_SOCKET_IFNAME'] = _pdl_saved
""",
    ),
}
#: What each planted fault must be reported as (rank, reason).
FOUND = {
    "horovod": (1, "horovod 0.0.1 differs from "),
    "iface": (2, "interface bogus0 (GLOO_SOCKET_IFNAME) does not exist"),
}


@contextlib.contextmanager
def planted(session, fault: str):
    """Inject ``fault`` into the engine process of its rank; take it out afterwards."""
    rank = FOUND[fault][0]
    view = session.client[session.world(len(SLOTS))[rank].engine_id]
    plant, undo = PLANT[fault]
    view.execute(plant, block=True)
    try:
        yield
    finally:
        view.execute(undo, block=True)


@contextlib.contextmanager
def magics_for(shell, session):
    """Bind ``%%distributed``/``%pdl`` in ``shell`` to ``session`` (as ``%load_ext`` would)."""
    magics = DistributedMagics(shell, session=session)
    shell.register_magics(magics)
    yield magics


@pytest.fixture(scope="module")
def ip(pdl_session):
    shell = InteractiveShell.instance()
    shell.register_magics(DistributedMagics(shell, session=pdl_session))
    return shell


@pytest.fixture
def marker(tmp_path):
    """A file every rank appends its rank to when a cell runs."""
    return tmp_path / "ran"


def marker_cell(path) -> str:
    return f"with open({str(path)!r}, 'a') as f:\n    f.write(f'{{rank}}\\n')\nprint('cell ran')\n"


def assert_found_only(problems: list[str], fault: str) -> None:
    rank, reason = FOUND[fault]
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"rank {rank} on {HOST}: {reason}"), problems


@pytest.mark.integration
def test_check_shows_every_rank_with_versions_interface_and_bandwidth(ip, pdl_session):
    import psutil
    import torch

    with capture_output() as cap:
        result = ip.run_cell("%pdl check")
    assert result.error_in_exec is None, cap.stdout + cap.stderr
    (shown,) = cap.outputs
    assert "<table" in shown.data["text/html"]
    text = shown.data["text/plain"].splitlines()
    assert text[0].split()[:3] == ["rank", "host", "slot"] and len(text) == 2 + len(SLOTS)
    rows = [line.split() for line in text[2:]]
    for rank, row in enumerate(rows):
        assert row[:3] == [str(rank), HOST, SLOTS[rank]]
        assert torch.__version__ in row and row[-1] == "✓"
        assert float(row[-2]) > 0  # the all-reduce's bus bandwidth, GB/s

    # the same from Python: a report whose rows carry the versions of every rank
    report = run_checks(pdl_session.engines, pdl_session.group, pdl_session.world(len(SLOTS)))
    assert report.ok and len(report.rows) == len(SLOTS)
    assert {r["torch"] for r in report.rows} == {torch.__version__}
    for row in report.rows:  # e.g. "lo (address 127.0.0.1)": an interface this host has
        name, source = row["interface"].split(" ", 1)
        assert name in psutil.net_if_stats() and source.startswith("(address ")
    assert all(s["busbw_gbs"] > 0 and s["value"] == 6.0 for s in report.smoke)
    assert sum(report.seconds.values()) < 1.0, report.seconds  # warm engines, 3 CPU ranks


@pytest.mark.integration
def test_check_smoke_tests_horovod_and_two_ranks(ip):
    pytest.importorskip("horovod.torch")
    with capture_output() as cap:
        result = ip.run_cell("%pdl check -n 2 --backend horovod")
    assert result.error_in_exec is None, cap.stdout + cap.stderr
    rows = [line.split() for line in cap.outputs[0].data["text/plain"].splitlines()[2:]]
    assert [row[0] for row in rows] == ["0", "1"] and all(float(row[-2]) > 0 for row in rows)


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["horovod", "iface"])
def test_check_names_the_rank_and_host_of_a_planted_fault(ip, pdl_session, fault):
    with planted(pdl_session, fault):
        with capture_output() as cap:
            result = ip.run_cell("%pdl check")
        error = result.error_in_exec
        assert isinstance(error, PreflightFailed), cap.stdout + cap.stderr
        assert_found_only(str(error).splitlines(), fault)
        shown = strip_ansi(cap.stdout + cap.stderr)
        assert f"rank {FOUND[fault][0]} on {HOST}: {FOUND[fault][1]}" in shown
        assert "Traceback" not in shown and "pdl_magics" not in shown
        assert "✗" in cap.outputs[0].data["text/plain"]  # the table is shown too
    with capture_output():
        ip.run_line_magic("pdl", "check")  # fault gone: passes again


def across_hosts(world):
    """``world`` as if each rank ran on its own node, at its own loopback address (the
    engines stay where they are: the ranks now meet on a TCPStore and check their routes)."""
    return [dataclasses.replace(r, host=f"node-{r.rank}", addr=f"127.0.0.{r.rank + 1}") for r in world]


@contextlib.contextmanager
def no_route_yet(session, rank: int, addr: str, for_s: float):
    """For ``for_s`` seconds from now, rank ``rank``'s engine finds no route to ``addr``
    (as on an overlay network whose node has not yet learnt where a new container runs)."""
    view = session.client[session.world(len(SLOTS))[rank].engine_id]
    session.group.forget()  # the group of these engines, if any, is formed anew
    view.execute(f"""
import errno, time
import pdl.runtime.peer_routes as _pdl_routes
_pdl_real_probe, _pdl_routed_at = _pdl_routes.probe, time.monotonic() + {for_s!r}
def _pdl_probe(addr, timeout_s):
    if addr == {addr!r} and time.monotonic() < _pdl_routed_at:
        time.sleep(min(timeout_s, 0.05))
        return errno.EHOSTUNREACH
    return _pdl_real_probe(addr, timeout_s)
_pdl_routes.probe = _pdl_probe
""", block=True)
    try:
        yield
    finally:
        view.execute("_pdl_routes.probe = _pdl_real_probe", block=True)
        session.group.forget()  # the next test forms its group on the real world


@pytest.mark.integration
def test_a_group_across_hosts_waits_for_a_route_that_comes_late(pdl_session):
    world = across_hosts(pdl_session.world(len(SLOTS)))
    started = time.monotonic()
    with no_route_yet(pdl_session, 1, "127.0.0.3", for_s=2.0):
        report = run_checks(pdl_session.engines, pdl_session.group, world)
    assert report.ok, report.problems
    assert time.monotonic() - started >= 2.0  # the group formed once rank 1 reached rank 2
    assert all(s["value"] == 6.0 for s in report.smoke)  # and its all-reduce went through


@pytest.mark.integration
def test_a_route_that_never_comes_is_named_by_rank_host_and_address(pdl_session, monkeypatch):
    monkeypatch.setattr(group_module, "PEER_ROUTE_WAIT_S", 1.0)
    world = across_hosts(pdl_session.world(len(SLOTS)))
    with no_route_yet(pdl_session, 1, "127.0.0.3", for_s=600.0):
        report = run_checks(pdl_session.engines, pdl_session.group, world)
    assert [p.reason for p in report.problems] == [
        "rank 1 (node-1) has no route to 127.0.0.3 after 1 s: the cluster's network does not "
        "connect the engines of this server (ask the admin to check it)"]
    assert not report.smoke  # nothing ran


@pytest.mark.integration
@pytest.mark.parametrize("line, fragments", [
    ("bogus", ["unknown subcommand 'bogus'", "valid: check"]),
    ("", ["needs a subcommand", "valid: check"]),
    ("check -n 9", ["-n 9", "1..3"]),
    ("check --backend mpi", ["'mpi'", "torch, horovod"]),
    ("check --bogus", ["--bogus", "%pdl check [-n N]", "%pdl scale --loss NAME"]),
])
def test_bad_pdl_lines_are_a_one_line_usage_error(ip, line, fragments):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("pdl", line)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A new session whose engines are up but that has run no cell yet."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("PDL_STATUS_DIR", str(tmp_path / "status"))
    monkeypatch.delenv("PDL_CLUSTER_FILE", raising=False)
    session = DistributedSession(local_slots=SLOTS)
    try:
        session.world(len(SLOTS))
        yield session
    finally:
        session.close()


@pytest.mark.integration
def test_the_first_cell_of_a_session_does_not_run_until_the_preflight_passes(ip, pdl_session, fresh, marker):
    def first_cell():
        marker.unlink(missing_ok=True)
        with capture_output() as cap:
            result = ip.run_cell("%%distributed\n" + marker_cell(marker))
        ran = sorted(marker.read_text().split()) if marker.exists() else []
        return result.error_in_exec, strip_ansi(cap.stdout + cap.stderr), ran

    try:
        with magics_for(ip, fresh) as magics:
            for fault in ("horovod", "iface"):
                with planted(fresh, fault):
                    error, shown, ran = first_cell()
                    assert isinstance(error, PreflightFailed), shown
                    assert ran == [] and "cell ran" not in shown
                    assert_found_only(str(error).splitlines(), fault)
                    assert shown.startswith("Preflight failed (1 problem):") and "Traceback" not in shown
                    assert "The cell did not run" in shown

            # turned off: on the magics (DistributedMagics.preflight) or on the session
            with planted(fresh, "horovod"):
                magics.preflight = False
                assert first_cell()[::2] == (None, ["0", "1", "2"])
                magics.preflight = True
                fresh.preflight = False
                assert first_cell()[::2] == (None, ["0", "1", "2"])
                fresh.preflight = True
                assert isinstance(first_cell()[0], PreflightFailed)

            # fault gone: the cell runs, and its engines are not checked again
            error, shown, ran = first_cell()
            assert (error, ran) == (None, ["0", "1", "2"]), shown
            assert shown == "cell ran\n"  # a passing preflight prints nothing
            with planted(fresh, "horovod"):
                assert first_cell()[::2] == (None, ["0", "1", "2"])
    finally:
        ip.register_magics(DistributedMagics(ip, session=pdl_session))


@pytest.mark.integration
def test_a_new_set_of_engines_is_checked_again(fresh):
    fresh.run("pass", 2, out=io.StringIO(), err=io.StringIO())
    with planted(fresh, "horovod"):
        fresh.run("pass", 2, out=io.StringIO(), err=io.StringIO())  # ranks 0, 1 passed before
        with pytest.raises(PreflightFailed) as info:
            fresh.run("pass", 3, out=io.StringIO(), err=io.StringIO())  # rank 2 joins: checked
    assert_found_only(str(info.value).splitlines(), "horovod")


@pytest.mark.integration
@pytest.mark.timing
def test_a_rank_hanging_in_the_all_reduce_is_named_within_the_timeout(pdl_session, monkeypatch):
    """Fault: rank 2's all_reduce never returns. The others give up after the smoke
    test's timeout, rank 2 is interrupted, and the next cell gets a new group."""
    from pdl_magics import preflight

    monkeypatch.setattr(preflight, "SMOKE_TIMEOUT_S", 2.0)
    monkeypatch.setattr(preflight, "SMOKE_GRACE_S", 1.0)
    world = pdl_session.world(len(SLOTS))
    pdl_session.run("pass", len(SLOTS), out=io.StringIO(), err=io.StringIO())  # the torch group is up
    rank2 = pdl_session.client[world[2].engine_id]
    rank2.execute("import time, torch.distributed as dist\n_pdl_saved = dist.all_reduce\n"
                  "dist.all_reduce = lambda *args, **kwargs: time.sleep(3600)\n", block=True)
    try:
        started = time.monotonic()
        report = run_checks(pdl_session.engines, pdl_session.group, world)
        elapsed = time.monotonic() - started
    finally:
        rank2.execute("import torch.distributed as dist\ndist.all_reduce = _pdl_saved\n", block=True)
    assert elapsed < 3.0 + 2.0, f"took {elapsed:.1f} s"
    assert [str(p) for p in report.problems] == [
        f"rank 0 on {HOST}: all-reduce did not finish within 2 s",
        f"rank 1 on {HOST}: all-reduce did not finish within 2 s",
        f"rank 2 on {HOST}: did not answer the all-reduce within 3 s",
    ]
    result = pdl_session.run("import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()",
                             len(SLOTS), out=io.StringIO(), err=io.StringIO())
    assert result.values == ["3.0"] * 3
