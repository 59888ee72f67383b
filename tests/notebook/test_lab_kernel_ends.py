"""What a kernel's successor is told about its end (pdl_lab/kernel_ends.py): the line for
a kernel that the user's memory limit ended, and the kernel side that prints it once,
before the first cell. A real server and a real OOM kill: tests/hub/test_hub_neighbours.py."""

from __future__ import annotations

import signal

import pytest
from IPython.core.interactiveshell import InteractiveShell

from pdl import memory_limit
from pdl_lab import kernel_ends

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def test_only_a_kernel_killed_while_the_oom_killer_ended_a_process_is_named(monkeypatch):
    monkeypatch.setattr(memory_limit, "limit_bytes", lambda: 2 << 30)
    line = kernel_ends.ended_line(-signal.SIGKILL, 3, 4, NOW)
    assert line == ("Your kernel was ended at 08:00:00 UTC by your memory limit of 2 GiB (all your processes "
                    "together, as the admin set it); this is a new kernel: its variables are gone. Use less "
                    "memory, or ask the admin for a larger mem_limit.")
    for exit_code, before, now in ((-signal.SIGKILL, 4, 4),  # killed, but no OOM kill: someone's kill -9
                                   (1, 3, 4),  # it exited (an error) while an engine was OOM-killed
                                   (-signal.SIGSEGV, 3, 4), (None, 3, 4),
                                   (-signal.SIGKILL, None, 4), (-signal.SIGKILL, 3, None)):  # no memory cgroup
        assert kernel_ends.ended_line(exit_code, before, now, NOW) is None, (exit_code, before, now)


def test_the_notice_lies_beside_the_kernels_connection_file(tmp_path):
    assert kernel_ends.notice_file(tmp_path / "kernel-abc.json") == tmp_path / "pdl-kernel-abc-ended.txt"


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def test_the_new_kernel_says_it_before_its_first_cell_once_and_removes_it(tmp_path, monkeypatch, capsys, shell):
    import ipykernel.connect

    connection = tmp_path / "kernel-abc.json"
    monkeypatch.setattr(ipykernel.connect, "get_connection_file", lambda: str(connection))
    kernel_ends.notice_file(connection).write_text("Your kernel was ended at 08:00:00 UTC by ...\n")
    kernel_ends.load_ipython_extension(shell)
    assert not kernel_ends.notice_file(connection).exists()
    shell.run_cell("print('first')")
    assert capsys.readouterr() == ("first\n", "Your kernel was ended at 08:00:00 UTC by ...\n")
    shell.run_cell("print('second')")
    assert capsys.readouterr() == ("second\n", "")


def test_without_a_notice_or_outside_a_kernel_nothing_is_said(tmp_path, monkeypatch, capsys, shell):
    import ipykernel.connect

    monkeypatch.setattr(ipykernel.connect, "get_connection_file", lambda: str(tmp_path / "kernel-abc.json"))
    kernel_ends.load_ipython_extension(shell)
    monkeypatch.setattr(ipykernel.connect, "get_connection_file", lambda: (_ for _ in ()).throw(RuntimeError("no app")))
    kernel_ends.load_ipython_extension(shell)
    shell.run_cell("print('cell')")
    assert capsys.readouterr() == ("cell\n", "")
