"""Waiting for one distributed cell on every rank (:class:`CellWatch`).

The watch streams rank 0's output live (every rank's is kept), shows ``pdl.log``
progress, and when a rank fails first on its own, gives its peers
:data:`PEER_GRACE_S` and then releases and interrupts them. A rank is reported as stuck
(and its engine restarted) when it is still running :data:`STOP_TIMEOUT_S` after both
the interrupt reached it and the last of its peers stopped: on a busy machine the
interrupt and the peers' results take their time, and a rank still waiting for a peer
that stopped a moment ago is not stuck. A rank that reported its user's code stopped
(:data:`pdl.engine_channel.STOPPED_KEY`) is winding down PDL's side of the cell
(its process group's teardown), which a busy machine can stretch over seconds: it is
not interrupted again, and counts as stuck only after :data:`WIND_DOWN_TIMEOUT_S`.
A rank whose engine died
is reported at once (:data:`~pdl_magics.errors.ENGINE_DIED`). The hang watchdog shows
every running rank's stack after ``hang_timeout_s`` without progress (:mod:`pdl.runtime.stacks`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

import ipyparallel as ipp

from pdl import memory_limit
from pdl.engine_channel import STACK_KEY, STACK_SIGNAL, STOPPED_KEY
from pdl.metrics import DATA_KEY
from pdl_server.session_clock import session_end
from pdl_server.world import CellResult, Rank

from .engines import Engines
from .errors import ENGINE_DIED, RankFailed, RanksInterrupted
from .progress import LiveProgress

#: Seconds a peer may keep running after another rank failed before PDL
#: releases it (tears down the group it waits in, then interrupts it).
PEER_GRACE_S = 1.0
#: Seconds a rank may go on running after the interrupt reached it and after the last
#: of its peers stopped; then it is reported as stuck.
STOP_TIMEOUT_S = 5.0
#: Seconds a rank that reported its user's code stopped may take to wind down PDL's side
#: of the cell (tear down its process group, free what referenced it) before it counts
#: as stuck: a teardown that takes half a second alone took over 5 s on a busy machine.
WIND_DOWN_TIMEOUT_S = 60.0
#: Seconds between polls for output and results while a cell runs; the last
#: rank's result ends the wait at once.
POLL_S = 0.05
#: Seconds to wait, after the last result, for ranks' output still in flight.
OUTPUT_WAIT_S = 1.0
#: Seconds to wait for the ranks' stacks once the watchdog asked for them.
STACK_WAIT_S = 3.0


@contextlib.contextmanager
def interrupts_as_flag() -> Iterator[threading.Event]:
    """While inside: SIGINT sets the yielded event instead of raising KeyboardInterrupt
    (the previous handler is back on leaving). Where signals cannot be caught here (off
    the main thread), SIGINT stays as it was and the event is never set."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


class CellWatch:
    """Waits for one cell on every rank, streaming rank 0 and stopping the rest on failure."""

    def __init__(self, engines: Engines, world, ars, out, err, hang_timeout_s: float = 0.0,
                 on_progress: Callable[[dict], None] | None = None):
        """Watch ``ars`` (one AsyncResult of ``run_cell`` per rank of ``world``) on
        ``engines``; rank 0's output goes to ``out``/``err``; ``on_progress(metrics)``
        is called at every poll with each rank's latest ``pdl.log`` snapshot."""
        self.engines, self.world, self.ars = engines, world, ars
        self.on_progress = on_progress
        # each rank's metadata dict, which ipyparallel updates in place as output and data
        # arrive (read directly: the AsyncResult attributes re-check and re-parse on every access)
        self.meta = [ar.metadata for ar in ars]
        self.out, self.err = out, err
        self.streamed = [0, 0]
        self.results: dict[int, dict] = {}
        self.trigger_at: float | None = None
        self.user_interrupt = False
        self.aborted = False
        self._aborted_ranks: set[int] = set()
        self.stuck: list[Rank] = []
        self._signalled_at: float | None = None
        self._signalled: set[int] = set()  # ranks an interrupt was sent to in this cell
        # when the stop last moved on: a rank got its first interrupt, or a rank stopped
        self._stop_moved_at: float | None = None
        #: rank -> when (monotonic s) the notebook saw its report that its user's code stopped
        self._stopped_seen: dict[int, float] = {}
        self.progress = LiveProgress(err)
        #: rank -> latest ``pdl.log`` snapshot of this cell
        self.metrics: dict[int, dict] = {}
        self._dead: set[int] = set()  # ranks whose engine died: no more output will come
        self._oom_kills = memory_limit.oom_kills()  # to tell a rank ended by the user's memory limit
        # the hang watchdog: when anything last changed, and whether that silence was reported
        self.hang_timeout_s = hang_timeout_s
        self._mark: tuple = ()
        self._progress_at = time.monotonic()
        self._hang_reported = False
        self._wake = threading.Event()  # set (from ipyparallel's IO thread) once every result is in
        for ar in ars:
            ar.add_done_callback(self._on_result)

    def _on_result(self, _) -> None:
        if all(ar.done() for ar in self.ars):
            self._wake.set()

    def pending(self) -> list[Rank]:
        return [r for r in self.world if r.rank not in self.results]

    @property
    def interrupted(self) -> bool:
        """True if any rank was interrupted (by the user, the Cluster panel or PDL)."""
        return any(res["status"] == "interrupted" for res in self.results.values())

    @property
    def dead(self) -> bool:
        """True if the engine of any rank died during the cell."""
        return bool(self._dead)

    @property
    def failed(self) -> bool:
        """True if any rank did not finish the cell normally."""
        return any(res["status"] != "ok" for res in self.results.values())

    def wait(self, interrupted: threading.Event | None = None) -> CellWatch:
        """Follow the ranks until every one has a result. Ctrl-C (SIGINT) while they run
        stops them all: it is taken as a flag between two looks (:func:`interrupts_as_flag`;
        ``interrupted``: the caller's, set since before the ranks started), so that it can
        never land between two steps of this loop and leave the ranks running (it once
        did, in the look for stuck ranks)."""
        with contextlib.nullcontext(interrupted) if interrupted is not None else interrupts_as_flag() as interrupted:
            while self.pending():
                try:
                    self._wake.wait(POLL_S)
                    if interrupted.is_set():
                        interrupted.clear()
                        raise KeyboardInterrupt
                    self._pump()
                    self._collect()
                    self._escalate()
                    self._watchdog()
                except KeyboardInterrupt:  # the flag's, or SIGINT where no flag could be set
                    if self.trigger_at is None or not self.user_interrupt:
                        self.user_interrupt = True
                        self.trigger_at = time.monotonic()
                        print(f"Interrupting {len(self.pending())} rank(s)...", file=self.err, flush=True)
                        self._signal_pending()
                self._find_stuck()
        self._await_output()
        self._pump()
        self.progress.close("ok" if not self.failed else "interrupted" if self.user_interrupt else "failed")
        return self

    def _find_stuck(self) -> None:
        """Give up on the ranks still running :data:`STOP_TIMEOUT_S` after the stop last
        moved on, unless they reported their user's code stopped (those get
        :data:`WIND_DOWN_TIMEOUT_S` from that report): their results read "Stuck"."""
        now = time.monotonic()
        timed_out = self._stop_moved_at is not None and now - self._stop_moved_at > STOP_TIMEOUT_S
        for r in self.pending():
            seen = self._stopped_seen.get(r.rank)
            if (now - seen > WIND_DOWN_TIMEOUT_S) if seen is not None else timed_out:
                self.stuck.append(r)
                self.results[r.rank] = {
                    "status": "interrupted", "ename": "Stuck", "comm_error": True,
                    "evalue": "did not respond to interrupts", "traceback": [], "time": time.time(),
                }

    def stuck_reason(self, rank: Rank) -> str:
        """How ``rank`` (one of :attr:`stuck`) was stuck, in words that follow "rank 1 (host)"."""
        if rank.rank in self._stopped_seen:
            return (f"stopped its code but did not end the cell within {WIND_DOWN_TIMEOUT_S:.0f} s "
                    "(stuck tearing down its process group)")
        return f"did not stop within {STOP_TIMEOUT_S:.0f} s (stuck in a collective or native code)"

    def _pump(self) -> None:
        """Write rank 0's new output and progress since the last poll; note the ranks
        that reported their user's code stopped (the stop moves on)."""
        for r, md in zip(self.world, self.meta):
            snap = md["data"].get(DATA_KEY)
            if snap is not None:
                self.metrics[r.rank] = snap
            if STOPPED_KEY in md["data"] and r.rank not in self._stopped_seen:
                self._stopped_seen[r.rank] = time.monotonic()
                if self.trigger_at is not None:
                    self._stop_moved_at = time.monotonic()
        self.progress.feed(self.metrics.get(0))
        if self.on_progress is not None:
            self.on_progress(self.metrics)
        md = self.meta[0]
        for i, (text, stream) in enumerate(((md["stdout"], self.out), (md["stderr"], self.err))):
            text = text or ""
            if len(text) > self.streamed[i]:
                stream.write(text[self.streamed[i]:])
                stream.flush()
                self.streamed[i] = len(text)

    def _await_output(self) -> None:
        """Wait (at most :data:`OUTPUT_WAIT_S`) until the output of every rank that
        replied is complete: a result can arrive before its last output and metrics."""
        deadline = time.monotonic() + OUTPUT_WAIT_S
        try:
            for r, ar in zip(self.world, self.ars):
                if ar.ready() and r.rank not in self._dead:
                    ar.wait_for_output(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            pass  # every rank has stopped already; keep what came

    def _collect(self) -> None:
        for r, ar in zip(self.world, self.ars):
            if r.rank in self.results or not ar.ready():
                continue
            try:
                res = ar.get()
            except (ipp.error.EngineError, ipp.error.RemoteError) as e:
                if isinstance(e, ipp.error.EngineError) or e.ename == "EngineError":
                    self._dead.add(r.rank)
                    why = memory_limit.ended_by_limit_line(self._oom_kills) or (
                        "its engine process exited during the cell (killed, out of memory, or its node went down)")
                    res = {"status": "error", "ename": ENGINE_DIED, "comm_error": False, "time": time.time(),
                           "evalue": why, "traceback": []}
                else:  # raised outside the cell's run (an interrupt in ipyparallel's own code: a stop)
                    res = {"status": "interrupted" if e.ename == "KeyboardInterrupt" else "error",
                           "ename": e.ename, "evalue": e.evalue, "traceback": e.render_traceback(),
                           "comm_error": False, "time": time.time()}
            self.results[r.rank] = res
            if res["status"] != "ok" and self.trigger_at is None:
                self.trigger_at = time.monotonic()
            if self.trigger_at is not None:
                self._stop_moved_at = time.monotonic()

    def _escalate(self) -> None:
        """After a failure: release peers stuck in a collective, then interrupt them."""
        if self.trigger_at is None or not self.pending():
            return
        waited = time.monotonic() - self.trigger_at
        if waited < PEER_GRACE_S:
            return
        # Finished ranks are idle: cutting their group's connections makes peers
        # blocked on them fail at once with a connection error, state intact.
        finished = [r for r in self.world
                    if r.rank in self.results and r.rank not in self._aborted_ranks | self._dead]
        for r in finished:
            self.engines.call_async(r.engine_id, "abort_group")
            self._aborted_ranks.add(r.rank)
            self.aborted = True
        if waited < 2 * PEER_GRACE_S:
            return  # give the released peers time to return before interrupting them
        if self._signalled_at is None or time.monotonic() - self._signalled_at > STOP_TIMEOUT_S:
            self._signal_pending()

    def _progress_mark(self) -> tuple:
        """A value that changes whenever any rank makes progress: new output, a
        ``pdl.log`` call, or a finished rank."""
        return (len(self.results), *(
            (len(md["stdout"] or ""), len(md["stderr"] or ""), (md["data"].get(DATA_KEY) or {}).get("count"))
            for md in self.meta
        ))

    def _watchdog(self) -> None:
        """Report, once per silence, a cell in which no rank made progress for ``hang_timeout_s``."""
        if not self.hang_timeout_s or self.trigger_at is not None:
            return  # off, or the cell is already being stopped
        now = time.monotonic()
        mark = self._progress_mark()
        if mark != self._mark:
            self._mark, self._progress_at, self._hang_reported = mark, now, False
        elif not self._hang_reported and now - self._progress_at >= self.hang_timeout_s:
            self._hang_reported = True
            self._report_hang(now - self._progress_at)

    def _report_hang(self, silent_s: float) -> None:
        """Ask the running ranks for their stacks (:mod:`pdl.runtime.stacks`) and print them."""
        running = self.pending()

        def count(r: Rank):
            return (self.meta[r.rank]["data"].get(STACK_KEY) or {}).get("count")

        before = {r.rank: count(r) for r in running}
        self.engines.send_signal(running, STACK_SIGNAL)
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and any(count(r) == before[r.rank] for r in running):
            time.sleep(POLL_S)
        lines = [
            f"No rank has made progress for {silent_s:.0f} s (no output, no pdl.log call, no rank "
            f"finished; --hang-timeout {self.hang_timeout_s:g}). Where each rank is now:"
        ]
        for r in self.world:
            if r.rank in self.results:
                lines.append(f"--- rank {r.rank} ({r.host}): finished the cell ---")
                continue
            lines.append(f"--- rank {r.rank} ({r.host}), most recent call last ---")
            if count(r) == before[r.rank]:
                lines.append("  (no stack: the engine did not answer)")
            else:
                lines += ["  " + line for line in self.meta[r.rank]["data"][STACK_KEY]["stack"]]
        lines.append("Still waiting. To stop every rank, press the stop button (Ctrl-C): "
                     "the engines and their variables stay.")
        print("\n".join(lines), file=self.err, flush=True)

    def _signal_pending(self) -> None:
        """Interrupt every rank still running its user's code (not those winding down);
        the stop clock starts again once the interrupt has reached (or was given up on
        for) a rank not interrupted before."""
        self._signalled_at = time.monotonic()
        pending = [r for r in self.pending() if r.rank not in self._stopped_seen]
        self.engines.interrupt(pending)  # returns once the engines confirmed it, or gave up
        first = {r.rank for r in pending} - self._signalled
        if first:
            self._signalled |= first
            self._stop_moved_at = time.monotonic()

    def finish(self) -> CellResult:
        failures = {k: v for k, v in self.results.items() if v["status"] != "ok"}
        if not failures:
            value = self.results[0].get("value")
            if value is not None:
                print(value, file=self.out)
            return CellResult(values=[self.results[r.rank].get("value") for r in self.world])
        own = {k: v for k, v in failures.items() if v["status"] == "error" and not v["comm_error"]}
        if not own and (self.user_interrupt or all(v["status"] == "interrupted" for v in failures.values())):
            print(f"Interrupted: all {len(self.world)} ranks stopped.", file=self.err, flush=True)
            raise RanksInterrupted
        pick_from = own or failures
        rank = min(pick_from, key=lambda k: (pick_from[k]["time"], k))
        others = sorted(set(failures) - {rank})
        note = ""
        if others:
            note = f"(ranks {', '.join(map(str, others))} were stopped as a result"
            note += "; the process group is rebuilt at the next cell)" if self.aborted else ")"
        if failures[rank]["ename"] == ENGINE_DIED and self.engines.is_hub:
            end = session_end()
            if end is not None and end.ending():  # not a crash: the session's time is up
                note = f"Your session ended ({end.ended_reason()}): the next cell asks for workers again."
        host = self.world[rank].host
        raise RankFailed(rank, host, failures[rank], note=note)
