"""Waiting in the fair queue: what the kinds whose queue is PDL's share (local, Swarm).

:class:`QueueingSpawner` is a mixin for a JupyterHub spawner. A spawn whose
``user_options["queue"]`` is true and that finds its workers busy calls
:meth:`QueueingSpawner.wait_in_queue`: it joins the hub's
:class:`~pdl_spawner.core.wait_queue.WaitQueue`, shows its position on the spawn page
(:meth:`QueueingSpawner.progress`) and, once it is at the head, takes its workers
through the spawner's own ``take`` (slots of the ledger, or GPUs of the swarm) as
soon as they are free. It waits on the event loop (never blocking the hub), leaves
the queue when the spawn is cancelled or ``queue_timeout`` passes, and
``start_timeout`` is extended by ``queue_timeout`` for such a spawn. A direct spawn
(or engines asked back after an idle release) is refused while anyone waits:
:meth:`QueueingSpawner.refuse_while_others_wait`.

It reads the queue's SQLite file, who and what is free from the spawner's
:class:`~pdl_spawner.core.worker_source.WorkerSource` (``self.workers``), and the spawn's
``chosen_gpu_type``, which :class:`~pdl_spawner.core.spawner.SpawnerCore` gives it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tornado import web
from traitlets import HasTraits, Integer, observe

from pdl_spawner.core import form
from pdl_spawner.hub import metrics
from pdl_spawner.hub.db_thread import off_loop
from pdl_spawner.core.wait_queue import WaitQueue

#: Seconds between a waiting spawn's looks at the queue and the free workers.
QUEUE_POLL_S = 1.0

T = TypeVar("T")


class NotFreeYet(Exception):
    """Raised by a ``take`` callback when the workers are not free (the spawn keeps waiting)."""


class QueueingSpawner(HasTraits):
    """Mixin: the fair queue for a spawner (see the module docstring)."""

    queue_timeout = Integer(
        3600,
        config=True,
        help="""Longest a user may wait in the queue for busy workers (seconds), after which
        the spawn fails. 0 turns the queue off: a busy request is refused at once.""",
    )

    #: What a spawn waiting in the queue shows on the spawn page (None when not waiting).
    _queue_status: str | None = None
    #: ``start_timeout`` as configured, before a queued spawn extends it.
    _configured_start_timeout: int | None = None

    # -- the queue ---------------------------------------------------------------------

    @property
    def wait_queue(self) -> WaitQueue:
        """The hub's queue of spawns waiting for workers."""
        return WaitQueue(self.workers.queue_db)

    @property
    def wants_queue(self) -> bool:
        options = self.user_options
        return isinstance(options, dict) and options.get("queue") is True

    async def waiting(self) -> list[tuple[str, int]] | None:
        """(user, workers) in queue order for the spawn form; None when the queue is off."""
        if not self.queue_timeout:
            return None
        return [(w.user, w.wanted) for w in await off_loop(self.wait_queue.waiters)]

    async def waiting_ahead(self) -> int:
        """How many wait in PDL's queue ahead of this server (0 with the queue off, and
        where the cluster's scheduler keeps the queue: the source's ``own_queue``)."""
        if not self.queue_timeout or self.workers.own_queue:
            return 0
        return len(await off_loop(self.wait_queue.ahead_of, self.owner_key, self.chosen_gpu_type))

    async def refuse_while_others_wait(self, *, spawning: bool = True) -> None:
        """HTTP 409 (one line) when others wait in the queue ahead of this server;
        ``spawning``: for a spawn (else for engines a cell asks back)."""
        waiting = await self.waiting_ahead()
        if waiting:
            message = form.queue_first_message(waiting, unit=self.worker_unit, spawning=spawning)
            metrics.refused("others_waiting")
            raise web.HTTPError(409, message, reason=message)

    @observe("user_options")
    def _extend_start_timeout_to_wait(self, change):
        """JupyterHub fails a start() that takes longer than ``start_timeout``: a spawn
        that waits in the queue gets ``queue_timeout`` more."""
        if self._configured_start_timeout is None:
            self._configured_start_timeout = self.start_timeout
        queued = isinstance(change.new, dict) and change.new.get("queue") is True
        self.start_timeout = self._configured_start_timeout + (self.queue_timeout if queued else 0)

    async def wait_in_queue(self, n: int, take: Callable[[], Awaitable[T]]) -> T:
        """Join the queue for ``n`` workers and wait, without blocking the hub, until this
        spawn is first and ``take()`` succeeds (it raises :class:`NotFreeYet` while the
        workers are busy); returns what ``take()`` returned. Cancelling the spawn
        (stopping the pending server) or ``queue_timeout`` leaves the queue."""
        if not self.queue_timeout:
            raise web.HTTPError(400, "the queue is off on this hub (queue_timeout = 0)")
        queue = self.wait_queue
        await off_loop(queue.join, self.owner_key, self.user.name, n, self.chosen_gpu_type)
        self.log.info("%s waits in the queue for %d %s", self.owner_key, n, self.worker_unit)
        joined = time.monotonic()
        try:
            while True:
                position = await off_loop(queue.position, self.owner_key)
                if position == 1:
                    try:
                        taken = await take()
                    except NotFreeYet:
                        pass
                    else:
                        metrics.waited(self.kind_name, time.monotonic() - joined)
                        return taken
                usage = await self.workers.usage()
                self._queue_status = form.queue_message(n, position, usage.free, usage.total, usage.holders,
                                                        show_names=bool(self.user.admin), unit=self.worker_unit)
                await asyncio.sleep(QUEUE_POLL_S)
                await off_loop(queue.beat, self.owner_key)
        finally:
            self._queue_status = None
            if await asyncio.shield(off_loop(queue.leave, self.owner_key)):
                self.log.info("%s left the queue", self.owner_key)

    def show_waiting(self, message: str | None) -> None:
        """What the spawn page shows while this spawn waits for its workers (None: nothing),
        for a spawner that waits in a queue of its own (e.g. Slurm's)."""
        self._queue_status = message

    async def progress(self):
        """While the spawn waits in the queue: its position and what is free (every
        :data:`QUEUE_POLL_S`, as it changes); then one message that the server starts."""
        shown = None
        while not self.workers.ready_to_start() and self.pending == "spawn":
            if self._queue_status != shown and self._queue_status is not None:
                shown = self._queue_status
                yield {"message": shown}
            await asyncio.sleep(QUEUE_POLL_S / 4)
        yield {"progress": 50, "message": "Starting your server and its engines..."}
