"""pdl_cinic10/compile_support.py: what torch.compile lacks on a GPU machine, in one line.

The machine's real tools are found; a missing one is made by an empty PATH or by
Python's include folder pointed elsewhere (the seam where the fault is injected).
"""

from __future__ import annotations

import sysconfig

import pytest

from pdl_cinic10 import compile_support
from pdl_cinic10.compile_support import c_compiler, compile_problem, python_header

pytestmark = pytest.mark.unit


def test_this_machines_compiler_and_python_header_are_found():
    assert c_compiler() is not None  # scripts/setup installs gcc
    assert python_header() is not None and python_header().name == "Python.h"


def test_without_a_c_compiler_the_problem_says_so_and_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compile_problem() == ("no C compiler ($CC, or gcc, clang on PATH), which torch.compile's Triton "
                                 "kernels need (install gcc)")


def test_cc_names_the_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "/opt/toolchain/bin/gcc-13")
    assert c_compiler() == "/opt/toolchain/bin/gcc-13"


def test_without_python_h_the_problem_says_so_unless_cpath_has_it(monkeypatch, tmp_path):
    empty = tmp_path / "include"
    empty.mkdir()
    real = sysconfig.get_paths()
    monkeypatch.setattr(compile_support.sysconfig, "get_paths", lambda: {**real, "include": str(empty)})
    monkeypatch.delenv("CPATH", raising=False)
    assert compile_problem() == (f"no Python.h (not in {empty} nor $CPATH), which torch.compile's Triton kernels "
                                 "are built against (install python3-dev)")
    headers = tmp_path / "bundle-headers"
    headers.mkdir()
    (headers / "Python.h").write_text("/* the bundle's */\n")
    monkeypatch.setenv("CPATH", f"/nowhere:{headers}")
    assert python_header() == headers / "Python.h"
