"""The tests' one way to wait for something: :func:`wait_until`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.2,
               what: str | Callable[[], str] = "condition") -> T:
    """Call ``predicate`` every ``interval`` s until it returns something truthy, and
    return that value (so ``pid = wait_until(find_pid, 30)`` waits for and gets it).

    Once ``timeout`` s have passed and one last call is still falsy, raises TimeoutError
    naming ``what``: a wait that never ends fails the test by itself, so callers need not
    assert on the result. ``what`` may be a callable, called only then, to say what was
    still wrong (e.g. which processes are left).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {described}")
        time.sleep(interval)
