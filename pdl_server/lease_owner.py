"""The one owner of a user's server's engine lease (:mod:`pdl.lease`).

It lives in the user's Jupyter server (:func:`this_servers_owner`, one a process) and
is the only writer of the lease's files; the hub, the supervisor (``pdl-singleuser``)
and the kernels ask it over the server's HTTP API (:mod:`pdl_server.lease_api`), the
Cluster panel in process. Each change counts one :attr:`LeaseOwner.version` and wakes
whoever waits for one (:meth:`LeaseOwner.wait_for_change`, a long poll): the hub learns
of a release, a request or a wish for more time, the supervisor of a grant, a kernel of
the hub's answer, as they happen.

It also orders a starting cell against an idle release: the supervisor asks to begin a
release (:meth:`LeaseOwner.begin_release`), which the owner refuses while a cell started
within the idle timeout, and a cell that starts while a release is being made waits for
it (:meth:`LeaseOwner.cell_start`), sees it, and asks again. Each request is decided on
the server's event loop, one at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import secrets
import threading
import time

from pdl.lease import (LONG_POLL_MAX_S, Answer, ExtendAnswer, GpuIdle, Grant, LeaseFiles, LeaseView, Release,
                       Want)
from pdl_server import session_clock

#: The longest a release may be in the making (seconds): past it, a cell waiting for it
#: goes on (the supervisor that began it is gone, or its answer was lost).
RELEASING_MAX_S = 120.0


class LeaseOwner:
    """One server's lease: its files (:class:`pdl.lease.LeaseFiles`), the release being
    made, and the version of its last change. Its methods run on the server's event loop,
    except :meth:`view`, which any thread may call."""

    def __init__(self, files: LeaseFiles):
        self.files = files
        self.epoch = secrets.token_hex(8)
        self.version = 0
        self._releasing_since: float | None = None
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future] = []

    # -- reading ------------------------------------------------------------------------

    def view(self) -> LeaseView:
        """The lease now (:class:`pdl.lease.LeaseView`), with this owner's version."""
        return dataclasses.replace(self.files.view(), releasing=self.releasing, version=self.version,
                                   epoch=self.epoch)

    @property
    def releasing(self) -> bool:
        """True while the supervisor stops the engines for a release it began."""
        started = self._releasing_since
        return started is not None and time.monotonic() - started < RELEASING_MAX_S

    async def wait_for_change(self, after: int, epoch: str, wait_s: float) -> LeaseView:
        """The lease once its version is above ``after`` (at once if it is, or if
        ``epoch`` is not this owner's: the asker knew another server), or after ``wait_s``
        seconds (at most :data:`pdl.lease.LONG_POLL_MAX_S`) as it is then."""
        if epoch != self.epoch:
            return self.view()
        waiter = asyncio.get_running_loop().create_future()
        with self._lock:
            if self.version > after:
                return self.view()
            self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout=max(0.0, min(wait_s, LONG_POLL_MAX_S)))
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self.view()

    def _changed(self) -> None:
        """Count one change and wake every waiter (from any thread)."""
        with self._lock:
            self.version += 1
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.get_loop().call_soon_threadsafe(functools.partial(_wake, waiter))

    # -- the hub's answers --------------------------------------------------------------

    def answer_request(self, answer: Answer) -> None:
        """The hub's answer to a request for workers. A grant of engines the hub started
        itself (Docker Swarm) also ends the release, in the same change: the hub's next
        look never finds the release it just answered."""
        self.files.write(answer)
        if isinstance(answer, Grant) and answer.started_by_hub:
            self.files.release_answered()
        self._changed()

    def answer_extension(self, answer: ExtendAnswer) -> None:
        """The hub's answer to a wish for more time, which it ends; the scheduler's end
        (Slurm's) is read afresh in this process, as the hub may have moved it."""
        self.files.answer_extension(answer)
        session_clock.forget_readings()
        self._changed()

    def flag_gpu_idle(self, flag: GpuIdle) -> None:
        """The hub's flag on GPUs held idle (``since`` 0: lifted)."""
        self.files.note_gpu_idle(flag)
        self._changed()

    # -- the supervisor's -------------------------------------------------------------

    def begin_release(self, idle_s: float | None = None) -> bool:
        """The supervisor is about to stop the engines: True, and a cell that starts now
        waits for the release; False (nothing changes) when they are released or being
        released already, or, for an idle release (``idle_s``: the idle timeout, seconds),
        when a cell started within ``idle_s``."""
        if self.releasing or self.files.released() is not None:
            return False
        if idle_s is not None and time.time() - self.files.cell_started_at() < idle_s:
            return False
        self._releasing_since = time.monotonic()
        self._changed()
        return True

    def end_release(self, release: Release | None) -> None:
        """The release the supervisor began is made (``release``), or was not (None: the
        engines still run)."""
        if release is not None:
            self.files.write(release)
        self._releasing_since = None
        self._changed()

    def take_up(self, grant: Grant) -> None:
        """The supervisor brought the engines back as ``grant`` says: it is what the server
        holds now; the release, the request, its answer and the GPU flag (on the GPUs
        given back) end."""
        self.files.keep_held(grant)
        self.files.note_gpu_idle(GpuIdle(since=0.0))
        self.files.end_release()
        self._changed()

    # -- a kernel's ---------------------------------------------------------------------

    async def cell_start(self) -> LeaseView:
        """A distributed cell starts: after any release being made, note the start (the
        supervisor keeps engines a cell started on within its idle timeout) and return the
        lease, whose release, if any, the cell asks to undo."""
        while self.releasing:
            await self.wait_for_change(self.version, self.epoch, LONG_POLL_MAX_S)
        self.files.note_cell_start()
        return self.view()

    def ask_again(self, want: Want) -> None:
        """A kernel asks for the released workers again (the count as it wrote it)."""
        self.files.write(want)
        self._changed()

    def forget_request(self) -> None:
        """The kernel read a refusal, or gave up waiting: the request and its answer end."""
        self.files.forget_request()
        self._changed()

    # -- the panel's --------------------------------------------------------------------

    def wish_extension(self, asked_at: float | None = None) -> None:
        """The user asks for more time (the panel's Extend; ``asked_at``: epoch seconds)."""
        self.files.wish_extension(time.time() if asked_at is None else asked_at)
        self._changed()


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


_OWNERS: dict[str, LeaseOwner] = {}


def this_servers_owner() -> LeaseOwner | None:
    """The lease owner of the hub server this process is (one for its cluster folder),
    or None outside one."""
    files = LeaseFiles.of_this_server()
    if files is None:
        return None
    return _OWNERS.setdefault(str(files.directory), LeaseOwner(files))
