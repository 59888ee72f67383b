"""PDL's series on JupyterHub's ``/hub/metrics``: who holds which workers and for how long.

Every series is in prometheus_client's default registry, the one JupyterHub serves at
``/hub/metrics`` (to holders of the ``read:metrics`` scope, e.g. the ``prometheus``
service of ``PDL_PROMETHEUS_TOKEN_FILE``), beside JupyterHub's own. Names follow
Prometheus' conventions (base units, ``_total`` for counters, ``_ratio`` for 0..1):

================================== ======================================== ===========
series                             labels                                   type
================================== ======================================== ===========
``pdl_workers_held``               user, kind, worker (gpu|cpu), gpu_type   gauge
``pdl_worker_seconds_total``       user, kind, worker, gpu_type             counter
``pdl_gpu_idle_seconds_total``     user, kind                               counter
``pdl_queue_length``               kind                                     gauge
``pdl_queue_wait_seconds``         kind                                     histogram
``pdl_gpu_utilization_ratio``      user (``user/name`` for a named          gauge
                                   server), gpu (its index among the
                                   server's)
``pdl_gpu_memory_used_bytes``      user, gpu (as above)                     gauge
``pdl_gpu_memory_total_bytes``     user, gpu (as above)                     gauge
``pdl_spawn_refusals_total``       reason (:data:`REFUSALS`)                counter
``pdl_session_extensions_total``   answer (granted|refused)                 counter
================================== ======================================== ===========

The holdings come from the kind's own status reader, the one the admin view draws
(:func:`pdl_spawner.admin.view.reader`: the slot ledger on one machine, Swarm's tasks,
Slurm's jobs), read every :attr:`PDLMetrics.sample_s` seconds on a thread of its own,
from the hub's start. Between two readings each held worker adds the seconds it was held
to ``pdl_worker_seconds_total`` and to the hub's usage book
(:mod:`pdl_spawner.hub.usage_book`, ``pdl-usage``), from when it was taken where that is
later than the last reading. Before workers are given back (a server's stop, a reclaim,
a take-back at a session's end) the hub takes a reading (:func:`count_until_now`), so
that they count up to then, whenever the last periodic reading was; nothing is counted
while the hub is down. ``pdl_gpu_idle_seconds_total``
counts, in the same way, the GPUs of a server flagged as held at 0 % use (the hub's GPU
watch, ``gpu_idle_flag_s``), from when they read 0 %. The events (refusals, waits,
extensions, GPU readings) are counted where they happen (:func:`refused`,
:func:`waited`, :func:`extension`, :func:`gpu_use`, :func:`gpu_memory`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from datetime import datetime

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from traitlets import Float
from traitlets.config import LoggingConfigurable

from pdl_spawner.hub.usage_book import UsageBook

#: The reasons of ``pdl_spawn_refusals_total``: not enough workers free; others wait in
#: the queue before it; a count outside the user's limit; an option that is not valid.
REFUSALS = ("not_enough_free", "others_waiting", "over_limit", "bad_request")

WORKERS_HELD = Gauge("pdl_workers_held", "Workers (a GPU, or a CPU slot) each user holds now.",
                     ["user", "kind", "worker", "gpu_type"])
WORKER_SECONDS = Counter("pdl_worker_seconds", "Seconds workers were held, per user (GPU-seconds for worker=gpu).",
                         ["user", "kind", "worker", "gpu_type"])
GPU_IDLE_SECONDS = Counter("pdl_gpu_idle_seconds", "GPU-seconds held at 0 % use (servers the hub flagged as "
                           "holding GPUs idle), per user.", ["user", "kind"])
QUEUE_LENGTH = Gauge("pdl_queue_length", "Spawns waiting in the queue for workers.", ["kind"])
QUEUE_WAIT = Histogram("pdl_queue_wait_seconds", "Seconds a spawn waited in PDL's queue before it got its workers.",
                       ["kind"], buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600))
GPU_UTILIZATION = Gauge("pdl_gpu_utilization_ratio", "Each held GPU's use at the hub's last reading (0..1).",
                        ["user", "gpu"])
GPU_MEMORY_USED = Gauge("pdl_gpu_memory_used_bytes", "Each held GPU's memory in use at the hub's last reading.",
                        ["user", "gpu"])
GPU_MEMORY_TOTAL = Gauge("pdl_gpu_memory_total_bytes", "Each held GPU's memory in all.", ["user", "gpu"])
SPAWN_REFUSALS = Counter("pdl_spawn_refusals", "Requests for workers refused, by reason.", ["reason"])
SESSION_EXTENSIONS = Counter("pdl_session_extensions", "Users' wishes for more time, by the hub's answer.",
                             ["answer"])

log = logging.getLogger("pdl.metrics")


def refused(reason: str) -> None:
    """Count a refused request for workers; ``reason`` one of :data:`REFUSALS`."""
    SPAWN_REFUSALS.labels(reason=reason).inc()


def waited(kind: str, seconds: float) -> None:
    """Count a spawn that got its workers after ``seconds`` in the queue."""
    QUEUE_WAIT.labels(kind=kind).observe(max(0.0, seconds))


def extension(granted: bool) -> None:
    """Count the hub's answer to a wish for more time."""
    SESSION_EXTENSIONS.labels(answer="granted" if granted else "refused").inc()


#: How many GPUs :func:`gpu_use` last reported per server (its owner key).
_gpus_reported: dict[str, int] = {}


def gpu_use(owner: str, readings: list[float] | None) -> None:
    """The hub's reading of the GPUs of ``owner``'s server (``user`` or ``user/name``;
    percent, one per GPU; None: not read, which leaves the last reading)."""
    if readings is None:
        return
    _remove(_gpus_reported.pop(owner, 0), owner, GPU_UTILIZATION)
    for index, percent in enumerate(readings):
        GPU_UTILIZATION.labels(user=owner, gpu=str(index)).set(percent / 100.0)
    _gpus_reported[owner] = len(readings)


#: How many GPUs :func:`gpu_memory` last reported per server (its owner key).
_memory_reported: dict[str, int] = {}


def gpu_memory(owner: str, readings: list[tuple[float, float]] | None) -> None:
    """The hub's reading of the memory of ``owner``'s GPUs ((used, in all) in bytes, one
    per GPU; None: not read, which leaves the last reading)."""
    if readings is None:
        return
    _remove(_memory_reported.pop(owner, 0), owner, GPU_MEMORY_USED, GPU_MEMORY_TOTAL)
    for index, (used, total) in enumerate(readings):
        GPU_MEMORY_USED.labels(user=owner, gpu=str(index)).set(used)
        GPU_MEMORY_TOTAL.labels(user=owner, gpu=str(index)).set(total)
    _memory_reported[owner] = len(readings)


def gpu_use_gone(owner: str) -> None:
    """``owner``'s server holds the GPUs :func:`gpu_use` and :func:`gpu_memory` reported no
    longer: their series go."""
    _remove(_gpus_reported.pop(owner, 0), owner, GPU_UTILIZATION)
    _remove(_memory_reported.pop(owner, 0), owner, GPU_MEMORY_USED, GPU_MEMORY_TOTAL)


def _remove(count: int, owner: str, *gauges: Gauge) -> None:
    """The series of ``owner``'s GPUs 0 .. ``count`` - 1 in ``gauges``, removed."""
    for index in range(count):
        for gauge in gauges:
            try:
                gauge.remove(owner, str(index))
            except KeyError:
                pass


def worker_of(slot: str) -> str:
    """``"cpu"`` for a CPU slot (``cpu:N``), else ``"gpu"`` (a GPU, a MIG slice, a GPU id)."""
    return "cpu" if slot.startswith("cpu") else "gpu"


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class PDLMetrics(LoggingConfigurable):
    """Reads the kind's status every :attr:`sample_s` seconds and turns it into the
    holding series (see the module's doc). ``reader`` returns the status model
    (blocking); ``kind`` is the hub's kind's name."""

    sample_s = Float(
        15.0, config=True,
        help="Seconds between two readings of who holds which workers, for /hub/metrics (a scrape starts them).",
    )

    def __init__(self, reader: Callable[[], dict], kind: str, book: UsageBook | None = None, **kwargs):
        super().__init__(**kwargs)
        self.reader, self.kind, self.book = reader, kind, book
        self._last: float | None = None  # up to when the last reading counted
        self._held: set[tuple[str, str, str]] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # one reading at a time: each counts from the last

    def sample(self, now: float | None = None) -> None:
        """One reading: the gauges set, the counters advanced by the time since the last."""
        with self._reading:
            self._sample(now)

    def sample_since(self, started: float) -> None:
        """A reading that counts up to ``started`` (epoch seconds) or later: one now,
        unless the last one already did (servers stopped together share one)."""
        with self._reading:
            if self._last is None or self._last < started:
                self._sample(None)

    def _sample(self, now: float | None) -> None:
        status = self.reader()
        now = time.time() if now is None else now
        last = self._last if self._last is not None else now
        rows = [r for r in status.get("reservations", []) if r.get("pdl", True) and r.get("user")
                and not str(r.get("slot", "")).startswith("(")]
        held: Tally = Tally()
        gpus_of: Tally = Tally()
        amounts: dict[tuple[str, str, str, str], float] = {}
        for row in rows:
            worker = worker_of(str(row["slot"]))
            key = (row["user"], worker, row.get("gpu_type", ""))
            held[key] += 1
            if worker == "gpu":
                gpus_of[row["owner"]] += 1
            since = now - row["held_s"]
            if now > max(since, last):
                seconds = now - max(since, last)
                WORKER_SECONDS.labels(user=key[0], kind=self.kind, worker=worker, gpu_type=key[2]).inc(seconds)
                booked = (key[0], self.kind, worker, key[2])
                amounts[booked] = amounts.get(booked, 0.0) + seconds
        for row in status.get("gpu_idle", []):
            since = _epoch(row["since"])
            if gpus_of[row["owner"]] and now > max(since, last):
                GPU_IDLE_SECONDS.labels(user=row["user"], kind=self.kind).inc(gpus_of[row["owner"]] * (now - max(since, last)))
        for user, worker, gpu_type in self._held - set(held):
            WORKERS_HELD.labels(user=user, kind=self.kind, worker=worker, gpu_type=gpu_type).set(0)
        for (user, worker, gpu_type), count in held.items():
            WORKERS_HELD.labels(user=user, kind=self.kind, worker=worker, gpu_type=gpu_type).set(count)
        self._held |= set(held)
        QUEUE_LENGTH.labels(kind=self.kind).set(len(status.get("queue", [])))
        if self.book is not None:
            self.book.add(now, amounts)
        self._last = now

    def start(self) -> None:
        """Read now and every :attr:`sample_s` seconds after, on a daemon thread (once)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="pdl-usage-sampler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        failing = False
        while True:
            try:
                self.sample()
                failing = False
            except Exception as e:  # a scheduler that does not answer: the next reading tries again
                if not failing:
                    log.warning("PDL metrics: cannot read who holds the workers: %s", e)
                failing = True
            time.sleep(self.sample_s)


class _StartOnScrape:
    """A collector of nothing that starts the sampler at the first scrape (in a process
    other than the hub, which starts it itself)."""

    def __init__(self, sampler: PDLMetrics):
        self.sampler = sampler

    def describe(self):
        return []  # registering asks for the names; it must not start the sampler

    def collect(self):
        self.sampler.start()
        return []


_registered: PDLMetrics | None = None

#: Most seconds a give-back waits for its reading (:func:`count_until_now`); past them the
#: workers count up to the periodic reading before.
READ_AT_RELEASE_S = 5.0


async def count_until_now() -> None:
    """Before workers are given back: a reading of who holds what (in the hub, once its
    sampler runs; nothing elsewhere), so that they count up to now. Never raises; waits
    at most :data:`READ_AT_RELEASE_S`."""
    sampler = _registered
    if sampler is None or sampler._thread is None:
        return
    started = time.time()
    try:
        await asyncio.wait_for(asyncio.to_thread(sampler.sample_since, started), READ_AT_RELEASE_S)
    except Exception as e:  # a scheduler that does not answer: the periodic readings count
        log.warning("PDL metrics: no reading before workers were given back: %s", e or type(e).__name__)


def register(sampler: PDLMetrics) -> None:
    """Start ``sampler`` now in the hub (its configuration loads in the running hub), else
    at the first scrape of /hub/metrics; once per process."""
    from jupyterhub.app import JupyterHub

    global _registered
    if _registered is None:
        _registered = sampler
        REGISTRY.register(_StartOnScrape(sampler))
        if JupyterHub.initialized():
            sampler.start()
