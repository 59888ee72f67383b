"""Idle engines give their workers back: the hub's side, shared by every PDL spawner.

The user's server stops counting on its engines after ``engine_idle_timeout``
seconds without a task and says so in its engine lease (:mod:`pdl.lease`);
a kernel that needs engines again asks in the same lease. While a server runs, the
hub waits on its lease (:meth:`IdleEngines.wait_for_lease`, a long poll of the lease's
owner in the user's server, which answers as soon as the lease changes) and looks at it
after each change, and whenever the spawner's own clocks say so
(:meth:`IdleEngines.lease_due_in_s`: a GPU reading, a session's end): that look is
:meth:`SpawnerCore.tend_lease <pdl_spawner.core.spawner.SpawnerCore.tend_lease>`, which
gives workers back and brings them back through the kind's
:class:`~pdl_spawner.core.worker_source.WorkerSource` (the local source frees ledger slots,
the Swarm source scales the engine services to 0 and back, the Slurm source ends the
job and submits a new one). All read and answer the lease the same way, over the user's
server's authenticated HTTP API (:meth:`IdleEngines.read_lease`,
:meth:`IdleEngines.answer_lease`, with the server's own API token): the hub never reads
or writes a file in a folder the user controls. What the lease says is the user's to
write, so the hub trusts none of it: a request's worker count is checked against the
same limits as a spawn's, and the reason it logs for a reclaim is its own
(:func:`idle_reason`). The watch starts with the server and again after a hub restart
(the first ``poll()`` that finds the server running), and ends in ``stop()``.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlencode

from tornado.simple_httpclient import SimpleAsyncHTTPClient
from traitlets import HasTraits, Integer

from pdl.lease import LONG_POLL_MAX_S, Answer, ExtendAnswer, LeaseFormatError, LeaseView, encode

#: Seconds the hub waits before it asks again a server that did not answer about its
#: lease (it is starting or stopping).
LEASE_RETRY_S = 1.0
#: The fewest seconds between two of the hub's waits on one server's lease: a change
#: is seen within that, and a server that answers at once, over and over, is asked no
#: more often.
LEASE_LOOK_GAP_S = 0.25
#: Seconds the hub waits for an answer from a user's server about its engine lease,
#: besides a long poll's own wait.
LEASE_HTTP_TIMEOUT_S = 10.0
#: Connections a spawner's lease client holds at once (its long poll, and its answers
#: beside it).
LEASE_HTTP_CLIENTS = 4


def idle_reason(idle_timeout_s: int) -> str:
    """The hub's own words for a reclaim of released engines (never the user's text):
    idle ones where idle reclaim is on (``idle_timeout_s`` > 0), else given back (at a
    session's end)."""
    return f"engines idle for {idle_timeout_s} s" if idle_timeout_s > 0 else "engines given back by their server"


class IdleEngines(HasTraits):
    """Mixin: the hub's watch over a server's engine lease (see the module docstring)."""

    engine_idle_timeout = Integer(
        0,
        config=True,
        help="""Seconds without a task on a user's engines after which they are stopped and
        their workers released; the notebook server and its files stay, and the next
        %%distributed cell asks for workers again (or says that none are free). 0: never.""",
    )

    _lease_task: asyncio.Task | None = None
    _lease_http: SimpleAsyncHTTPClient | None = None

    def lease_due_in_s(self) -> float:
        """Seconds until the spawner's own clocks need a look at the lease (a GPU reading,
        a session's end): :data:`pdl.lease.LONG_POLL_MAX_S` here, where none run."""
        return LONG_POLL_MAX_S

    async def wait_for_lease(self, seen: LeaseView | None, wait_s: float) -> LeaseView | None:
        """The lease once it has changed since ``seen`` (at once without one), or after
        ``wait_s`` seconds as it is then; None as :meth:`read_lease` says."""
        if seen is None:
            return await self.read_lease()
        query = urlencode({"after": seen.version, "epoch": seen.epoch, "wait": round(max(wait_s, 0.0), 3)})
        return await self.read_lease(query=query, wait_s=wait_s)

    async def read_lease(self, query: str = "", wait_s: float = 0.0) -> LeaseView | None:
        """The user's server's engine lease (``query``: a long poll's, answered within
        ``wait_s`` seconds), or None when the server does not answer (it is starting or
        stopping), says no, or sends something that is not a lease (a warning that quotes
        none of it)."""
        body = await (self.fetch_lease(query=query, wait_s=wait_s) if query else self.fetch_lease())
        if body is None:
            return None
        try:
            return LeaseView.from_json(body)
        except LeaseFormatError:
            self.log.warning("engine lease of %s: not a lease; ignored", self.owner_key)
            return None

    async def answer_lease(self, answer: Answer) -> None:
        """Send the user's server the hub's answer to its request (a grant or a refusal)."""
        await self.fetch_lease(encode(answer))

    async def answer_extension(self, answer: ExtendAnswer) -> None:
        """Send the user's server the hub's answer to its wish for more time."""
        await self.fetch_lease(encode(answer), part="extension")

    async def fetch_lease(self, body: dict | None = None, part: str = "", query: str = "",
                          wait_s: float = 0.0) -> dict | None:
        """``GET .../pdl/api/lease`` of the user's server (``?query``: a long poll, which
        the server answers within ``wait_s`` seconds), or with ``body``, POST it there
        (``part``: to ``.../lease/<part>``): the JSON object it answers, or None when it
        does not answer or says no. The hub's one exchange with a server about its lease
        (and the seam tests replace)."""
        url, token = self.workers.lease_url(), self.workers.lease_token()
        if not url or not token:
            return None
        if part:
            url = f"{url}/{part}"
        if query:
            url = f"{url}?{query}"
        if self._lease_http is None:
            # its own client: a long poll holds a connection for up to 30 s, and the hub's
            # shared one (10 at a time) also talks to the proxy and every server; tornado's
            # own, which holds no connection between requests
            self._lease_http = SimpleAsyncHTTPClient(force_instance=True, max_clients=LEASE_HTTP_CLIENTS)
        try:
            response = await self._lease_http.fetch(
                url, method="GET" if body is None else "POST", body=None if body is None else json.dumps(body),
                headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
                request_timeout=LEASE_HTTP_TIMEOUT_S + wait_s, raise_error=False,
            )
        except OSError:  # not listening (yet, or any more)
            return None
        if response.code != 200:
            if response.code != 599:
                self.log.warning("engine lease of %s: HTTP %s from its server", self.owner_key, response.code)
            return None
        try:
            body = json.loads(response.body)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self.log.warning("engine lease of %s: not a JSON object", self.owner_key)
            return None
        return body

    def lease_needs_watch(self) -> bool:
        """True when the lease is watched: idle reclaim is on, or the cluster's scheduler
        ends grants itself (engines can lose their workers by a Slurm job's time limit,
        and the next cell asks for them again); never where the source says its server
        records no release."""
        if not self.workers.lease_watched():
            return False
        return bool(self.engine_idle_timeout or self.workers.ends_grants)

    def watch_lease(self) -> None:
        """Start the watch (once) when :meth:`lease_needs_watch`."""
        if self.lease_needs_watch() and (self._lease_task is None or self._lease_task.done()):
            self._lease_task = asyncio.ensure_future(self._lease_loop())

    def unwatch_lease(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
            self._lease_task = None
        if self._lease_http is not None:
            self._lease_http.close()
            self._lease_http = None

    async def _lease_loop(self) -> None:
        """Wait on the lease, and look at it after each change and when a clock is due,
        never more often than every :data:`LEASE_LOOK_GAP_S` (a server that answers each
        long poll at once, as a user's own can, costs the hub no more)."""
        seen, looked = None, float("-inf")
        while True:
            try:
                await asyncio.sleep(max(0.0, looked + LEASE_LOOK_GAP_S - time.monotonic()))
                looked = time.monotonic()
                changed = await self.wait_for_lease(seen, self.lease_due_in_s())
                if changed is None:  # starting or stopping: ask again in a moment
                    await asyncio.sleep(LEASE_RETRY_S)
                seen = changed
                await self.tend_lease()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bad answer must not end the watch
                self.log.exception("engine lease of %s", self.owner_key)
                await asyncio.sleep(LEASE_RETRY_S)
