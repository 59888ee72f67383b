"""A distributed session: run one cell on N engines with torch.distributed ready.

This is the plain-Python object behind ``%%distributed``; it can be used without
IPython. It composes the session's :class:`~pdl_magics.engines.Engines` (connect,
count, rank order, signals, replacement) and its
:class:`~pdl_magics.group.ProcessGroup` (torch.distributed or Horovod), runs the
preflight (:mod:`~pdl_magics.preflight`) and waits for each cell
(:class:`~pdl_magics.cell_watch.CellWatch`)::

    from pdl_magics import DistributedSession
    s = DistributedSession()
    s.run("print(rank, world_size)", n=2)

Contract of :meth:`DistributedSession.run`:

- the first ``n`` engines in rank order (host, then slot) form the world; the
  process group is created once and reused while ``n`` and the backend stay the same;
- ``backend="torch"`` initialises torch.distributed (NCCL on GPUs, gloo on CPUs);
  ``backend="horovod"`` initialises Horovod (``hvd`` is defined in the cell)
  against a rendezvous this session runs (:mod:`~pdl_magics.horovod_driver`).
  An engine is in one group at a time: switching backends tears the old one down;
- before the first cell on a set of engines, the preflight (:mod:`~pdl_magics.preflight`)
  checks them; when it fails, :class:`~pdl_magics.preflight.PreflightFailed` is raised and
  nothing runs;
- rank 0's stdout/stderr are written to ``out``/``err`` live; every rank's output
  is kept in :attr:`DistributedSession.last_outputs`;
- when a rank raises, :class:`~pdl_magics.errors.RankFailed` is raised for the
  rank that failed first on its own (not one that merely lost its peer), after
  every other rank has stopped;
- on KeyboardInterrupt every rank is interrupted; the call returns (re-raising
  KeyboardInterrupt) once they have all stopped, leaving the engines usable;
- when an engine dies mid-cell (killed, out of memory, its node lost), the cell
  fails within seconds naming that rank and host; the engine is replaced on the
  same reserved slot before the next cell, so the next cell runs; where the session's
  end stopped the engines (the server released them), the cell raises
  :class:`~pdl_magics.errors.EnginesReleased` instead, one line saying so, and the next
  cell asks for engines again;
- the hang watchdog: when no rank has made progress (new output, a ``pdl.log``
  call, a rank finishing) for ``hang_timeout_s``, the cell says so once and shows
  every running rank's Python stack (:mod:`pdl.runtime.stacks`), then keeps waiting.
"""

from __future__ import annotations

import ast
import io
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TextIO

import ipyparallel as ipp

from pdl.balance.plan import MODES as BALANCE_MODES
from pdl_server import clusters, status_file
from pdl_server.world import CellResult, Rank

from . import horovod_driver, preflight, scale
from .cell_watch import CellWatch, interrupts_as_flag
from .engines import Engines
from .errors import ENGINE_DIED, DistributedUsageError, EnginesReleased, RankFailed
from .group import ProcessGroup
from .preflight import PreflightFailed

#: Backends ``--backend`` accepts.
BACKENDS = ("torch", "horovod")

#: Default of the hang watchdog: seconds without progress on any rank before the
#: cell shows every rank's stack (0 turns it off).
HANG_TIMEOUT_S = 300.0
#: Default of ``timeout_s`` (``--timeout``): seconds a collective may wait for its peers.
COLLECTIVE_TIMEOUT_S = 1800.0


def check_options(backend: str = "torch", timeout_s: float = COLLECTIVE_TIMEOUT_S,
                  hang_timeout_s: float = HANG_TIMEOUT_S, balance: str = "auto") -> None:
    """Raise DistributedUsageError (one line, naming what is valid) for a bad backend,
    timeout or balance mode; the magics and the Python API both pass through here."""
    if balance not in BALANCE_MODES:
        raise DistributedUsageError(f"balance must be one of {', '.join(BALANCE_MODES)}, got {balance!r}")
    if backend not in BACKENDS:
        raise DistributedUsageError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise DistributedUsageError(f"--timeout (timeout_s) must be > 0 seconds, got {timeout_s}")
    if not (isinstance(hang_timeout_s, (int, float)) and 0 <= hang_timeout_s < math.inf):
        raise DistributedUsageError(
            f"--hang-timeout (hang_timeout_s) must be >= 0 seconds (0: off), got {hang_timeout_s}"
        )
    if backend == "horovod":
        horovod_driver.require()


class DistributedSession:
    """Runs cells on the engines of this user's cluster (hub) or a local one.

    ``cluster_file`` selects an existing cluster (the hub case; default from
    ``$PDL_CLUSTER_FILE``). Without one, a local cluster is started on first use
    over ``local_slots`` (default: this machine's GPUs, else CPU slots).
    """

    _default: DistributedSession | None = None

    def __init__(self, cluster_file: str | None = None, local_slots: list[str] | None = None,
                 preflight: bool = True):
        #: this session's engines (:class:`~pdl_magics.engines.Engines`)
        self.engines = Engines(cluster_file or clusters.hub_cluster_file(), local_slots,
                               name=f"pdl-local-{id(self):x}")
        #: the process group of the current world (:class:`~pdl_magics.group.ProcessGroup`)
        self.group = ProcessGroup(self.engines)
        #: run :mod:`~pdl_magics.preflight` before the first cell on each set of engines
        self.preflight = preflight
        #: the worlds (:meth:`Engines.identity`) that passed it in this session
        self.preflight_passed: set[frozenset] = set()
        self._cell_number = 0
        self.last_outputs: dict[int, tuple[str, str]] = {}
        #: rank -> the last ``pdl.log`` snapshot of the last cell (see :mod:`pdl.metrics`)
        self.last_metrics: dict[int, dict] = {}
        self.last_world: list[Rank] = []
        # status writes happen on this one thread, in order, so a cell never waits for the disk
        self._status_writer = ThreadPoolExecutor(1, thread_name_prefix="pdl-status")

    @classmethod
    def default(cls) -> DistributedSession:
        """The process-wide session the magics use."""
        if cls._default is None:
            cls._default = cls()
        return cls._default

    @property
    def is_hub(self) -> bool:
        return self.engines.is_hub

    @property
    def client(self) -> ipp.Client | None:
        """The ipyparallel client of this session's engines; None until the first cell connects."""
        return self.engines.client

    def world(self, n: int | None = None) -> list[Rank]:
        """The first ``n`` workers in rank order (default: all of them); see :meth:`Engines.world`."""
        return self.engines.world(n)

    # -- running ---------------------------------------------------------------

    def run(
        self,
        code: str,
        n: int | None = None,
        *,
        backend: str = "torch",
        all_output: bool = False,
        timeout_s: float = COLLECTIVE_TIMEOUT_S,
        hang_timeout_s: float = HANG_TIMEOUT_S,
        out: TextIO | None = None,
        err: TextIO | None = None,
        preflight: bool = True,
        balance: str = "auto",
    ) -> CellResult:
        """Run ``code`` on ``n`` ranks (default: every available engine). See module doc.

        ``timeout_s``: how long a collective may wait for its peers (seconds);
        ``hang_timeout_s``: the hang watchdog's period without progress (seconds, 0: off);
        ``preflight=False`` (or the session's) skips the preflight before the first cell;
        ``balance``: the cell's mode of balanced batches, "auto", "on" or "off"
        (:func:`pdl.balanced_batches`).
        """
        out = out or sys.stdout
        err = err or sys.stderr
        check_options(backend, timeout_s, hang_timeout_s, balance)
        world = self.world(n)
        try:
            return self._run_on(world, code, backend, all_output, timeout_s, hang_timeout_s, out, err,
                                preflight, balance)
        except (RankFailed, PreflightFailed, ipp.error.EngineError, ipp.error.RemoteError) as error:
            if not _an_engine_died(error):
                raise
            released = self.engines.released_at_session_end()
            if released is None:
                raise
            raise EnginesReleased(f"Your engines were stopped during this cell ({released.reason}); "
                                  "the next cell asks for new ones.") from None

    def _run_on(self, world: list[Rank], code: str, backend: str, all_output: bool, timeout_s: float,
                hang_timeout_s: float, out: TextIO, err: TextIO, preflight: bool, balance: str) -> CellResult:
        """:meth:`run` on ``world``, its options checked."""
        if preflight and self.preflight:
            self._preflight_once(world, backend, timeout_s)  # raises PreflightFailed: nothing runs
        self.group.ensure(world, backend, timeout_s)
        self._cell_number += 1
        # from the moment the ranks start until the watch has their results, Ctrl-C is a
        # flag the watch acts on: it cannot land between two steps and leave them running
        with interrupts_as_flag() as interrupted:
            ars = [self.engines.call_async(r.engine_id, "run_cell", code, self._cell_number, balance) for r in world]
            self.last_world = world
            self.publish_status(running=True, force=True)
            outcome = CellWatch(self.engines, world, ars, out, err, hang_timeout_s,
                                on_progress=lambda metrics: self.publish_status(running=True, metrics=metrics)
                                ).wait(interrupted)
        self.last_outputs = {
            r.rank: (md["stdout"] or "", md["stderr"] or "") for r, md in zip(world, outcome.meta)
        }
        self.last_metrics = outcome.metrics
        self.publish_status(running=False, metrics=outcome.metrics, force=True)
        if outcome.aborted or outcome.stuck or outcome.user_interrupt or outcome.interrupted or outcome.dead or (
            backend == "horovod" and outcome.failed
        ):
            # Interrupted ranks may have stopped at different collectives; a group
            # kept across that would hang the next collective, so form a new one.
            # Horovod is rebuilt after any failure: its world may have shut itself
            # down, and its unnamed collectives are numbered per rank.
            self.group.forget()
        if outcome.stuck:
            self.engines.replace(outcome.stuck, outcome.stuck_reason, err)
        if all_output:
            self.show_output(range(1, len(world)), out)
        return outcome.finish()

    def scale(self, loss: str, model: str, images: int, n: int | None = None,
              err: TextIO | None = None) -> scale.ScaleReport:
        """``%pdl scale``: measure the step of ``loss()`` training ``model`` (names in the
        engines' namespace, ``images`` a rank) on the first ``n`` ranks (default: all), with
        torch.distributed, and predict it for more nodes and other links
        (:mod:`pdl_magics.scale`). DistributedUsageError (one line) for bad arguments.
        What the measuring cell prints is not shown (its value is the ranks' raw
        measurements); a rank's error goes to ``err`` as any cell's does."""
        if not (isinstance(images, int) and not isinstance(images, bool) and images >= 1):
            raise DistributedUsageError(f"--batch must be the images of one rank's step, a whole number >= 1, "
                                        f"got {images!r}")
        code = scale.measure_cell(loss, model)
        result = self.run(code, n, backend="torch", out=io.StringIO(), err=err)
        return scale.report([ast.literal_eval(value) for value in result.values], images)

    def check(self, n: int | None = None, backend: str = "torch",
              timeout_s: float = COLLECTIVE_TIMEOUT_S) -> preflight.PreflightReport:
        """``%pdl check``: the preflight on the first ``n`` ranks (default: all), as a cell
        with ``-n n --backend backend`` would run on them. Returns the report; raises only
        :class:`~pdl_magics.errors.DistributedUsageError` for bad arguments."""
        check_options(backend, timeout_s)
        world = self.world(n)
        return preflight.run_checks(self.engines, self.group, world, backend, timeout_s)

    def _preflight_once(self, world: list[Rank], backend: str, timeout_s: float) -> None:
        """The automatic preflight: run the checks unless this set of engines passed them
        already in this session; raise :class:`~pdl_magics.preflight.PreflightFailed` if any fails."""
        key = self.engines.identity(world)
        if key in self.preflight_passed:
            return
        preflight.run_checks(self.engines, self.group, world, backend, timeout_s).raise_if_failed(
            "The cell did not run. %pdl check shows every rank in a table."
        )
        self.preflight_passed.add(key)

    def show_output(self, ranks, out: TextIO | None = None) -> None:
        """Print the kept stdout/stderr of ``ranks`` from the last cell."""
        out = out or sys.stdout
        by_rank = {r.rank: r for r in self.last_world}
        for rank in ranks:
            if rank not in self.last_outputs:
                raise DistributedUsageError(
                    f"no output kept for rank {rank}; ranks of the last cell: "
                    f"{', '.join(map(str, sorted(self.last_outputs))) or 'none'}"
                )
            stdout, stderr = self.last_outputs[rank]
            print(f"--- rank {rank} ({by_rank[rank].host}) ---", file=out)
            if stdout:
                out.write(stdout if stdout.endswith("\n") else stdout + "\n")
            if stderr:
                out.write(stderr if stderr.endswith("\n") else stderr + "\n")
        out.flush()

    def publish_status(self, running: bool, metrics: dict | None = None, force: bool = False) -> None:
        """Tell the Cluster panel what this session runs (:mod:`pdl_server.status_file`).

        The file is written on a background thread, in call order, within milliseconds.
        """
        cluster = self.engines.cluster
        args = (cluster.cluster_file if cluster is not None else None, list(self.last_world))
        kwargs = dict(running=running, metrics=dict(metrics or {}), cell=self._cell_number,
                      slots=list(self.engines.pool()), hub=self.is_hub, force=force)
        try:
            self._status_writer.submit(status_file.write_status, *args, **kwargs)
        except RuntimeError:  # no new threads at interpreter exit: write here
            status_file.write_status(*args, **kwargs)

    def close(self) -> None:
        """Disconnect; a local cluster is stopped, a hub cluster is left running."""
        self.engines.close()
        self.group.close()
        try:  # after the writes still queued
            self._status_writer.submit(status_file.remove_status).result(timeout=10)
        except (RuntimeError, FutureTimeout):
            status_file.remove_status()


def _an_engine_died(error: Exception) -> bool:
    """Whether ``error`` (of a cell, its preflight or its process group's set-up) says that
    an engine died rather than that the user's code raised."""
    if isinstance(error, RankFailed):
        return error.engine_died
    if isinstance(error, PreflightFailed):
        return True  # a check that failed near the session's end: the release is the news
    return isinstance(error, ipp.error.EngineError) or getattr(error, "ename", None) in ("EngineError", ENGINE_DIED)
