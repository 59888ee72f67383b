"""The embedded default's workers: slots of one machine (``gpu:<i>``, ``mig:<n>``,
``cpu:<n>``) reserved in the hub's :class:`~pdl_spawner.core.reservations.SlotLedger`.

:class:`LedgerSlots` is the local kind's
:class:`~pdl_spawner.core.worker_source.WorkerSource`. Every ledger call is made off the
event loop (:mod:`~pdl_spawner.hub.db_thread`). A slot whose GPU a process of the user
still holds open is never freed (:meth:`LedgerSlots.reclaim_idle`); whatever still runs
in a slot's cgroup is ended before the slot is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from pdl.lease import Grant
from pdl.nvidia_smi import MigDevice, query_gpus
from pdl.slots import holds_gpu, mig_slots, parse_slot, slot_types
from pdl_spawner.core.reservations import NotEnoughSlots
from pdl_spawner.core.usage import MIB, NotEnoughWorkers, SchedulerLimits, WorkerUsage
from pdl_spawner.host.workers import HostWorkers
from pdl_spawner.hub.db_thread import off_loop

#: nvidia-smi path -> (GPU slot -> its type, MIG slot -> its device), read once per hub process.
MACHINE_GPUS: dict[str, tuple[dict[str, str], dict[str, MigDevice]]] = {}


class LedgerSlots(HostWorkers):
    """A local server's slots (see the module docstring); made with its
    :class:`~pdl_spawner.local.spawner.PDLLocalSpawner`."""

    unit = "workers"

    #: The holders last logged by :meth:`reclaim_idle` ("" none): logged once, not every look.
    _kept_for = ""

    @property
    def kind(self) -> str:
        pool = self.spawner.pool
        return "gpu" if pool and holds_gpu(pool[0]) else "cpu"

    @property
    def capacity(self) -> int:
        return len(self.spawner.pool)

    @property
    def queue_db(self) -> str:
        """The queue lives next to the ledger."""
        return self.spawner.reservations_db

    # -- GPU types --------------------------------------------------------------

    async def read_capacity(self) -> None:
        """Read the GPUs' types and MIG devices (``nvidia-smi``) the first time this hub
        process needs them, where the pool has GPU slots."""
        smi_path = self.spawner.nvidia_smi
        if smi_path not in MACHINE_GPUS and any(map(holds_gpu, self.spawner.pool)):
            smi = smi_path or None
            migs = await asyncio.to_thread(mig_slots, smi)
            types = await asyncio.to_thread(slot_types, smi, migs)
            MACHINE_GPUS[smi_path] = (types, migs)

    def gpu_types_for(self, options: dict) -> list[str]:
        """The types of the pool's GPUs (the same whatever the options)."""
        types = self.spawner.slot_types
        return sorted({types[s] for s in self.spawner.pool if s in types})

    async def gpu_type_usage(self) -> dict[str, tuple[int, int]]:
        """GPU type ("" : any) -> (free, total) slots of the pool, for the form."""
        spawner = self.spawner
        held = {h.slot for h in await off_loop(spawner.ledger.holdings)}
        found = {}
        for kind in ["", *self.gpu_types_for({})]:
            slots = [s for s in spawner.pool if not kind or spawner.slot_types.get(s) == kind]
            found[kind] = (sum(s not in held for s in slots), len(slots))
        return found

    # -- usage ------------------------------------------------------------------

    async def usage(self) -> WorkerUsage:
        await self.read_capacity()
        return await off_loop(self._usage, self.spawner.spawn_pool)

    def _usage(self, pool: list[str]) -> WorkerUsage:
        """``pool``, and the users holding its slots other than this server; blocks on the ledger."""
        holders: dict[str, int] = {}
        for h in self.spawner.ledger.holdings():
            if h.slot in pool and h.owner != self.owner_key:
                user = h.owner.split("/", 1)[0]
                holders[user] = holders.get(user, 0) + 1
        return WorkerUsage(total=len(pool), holders=holders)

    async def scheduler_limits(self) -> SchedulerLimits:
        """No cap on workers of this machine's own; its limits on the user's processes,
        in one line (:meth:`~pdl_spawner.host.server.HostServer.machine_limits_note`)."""
        return SchedulerLimits(note=self.spawner.machine_limits_note())

    async def take(self, n: int) -> list[str]:
        """``n`` free slots of the spawn's pool from the ledger (all or nothing)."""
        pool = self.spawner.spawn_pool
        try:
            return await off_loop(self.spawner.ledger.reserve, self.owner_key, n, pool)
        except NotEnoughSlots as e:
            raise NotEnoughWorkers(e.wanted, WorkerUsage(total=len(pool), holders=e.holders)) from None

    def release_blocking(self) -> list[str]:
        """End whatever still runs on this server's slots, then free every slot the ledger
        holds for it (blocks on the ledger)."""
        ledger, owner = self.spawner.ledger, self.owner_key
        self.spawner.end_slot_processes(ledger.held_by(owner))
        released = ledger.release(owner)
        if released:
            self.log.info("Released %s for %s", ",".join(released), owner)
        return released

    async def release(self) -> None:
        self.spawner.forget_port()
        await off_loop(self.release_blocking)

    # -- the engine lease ----------------------------------------------------------

    async def reclaim_idle(self) -> list[str] | None:
        """Free this server's slots in the ledger (logged as a reclaim); its device cgroup
        then opens no GPU. Only when no process of the user holds one of its GPUs open
        (a handle opened before, which the cgroup cannot take back): the user's processes
        are looked at, and when none holds one, looked at again after the cgroup stopped
        new opens. While one does, every slot stays reserved (the GPUs stay open to them)
        and this returns None (the next look tries again). The lease is the user's to
        write, so "released" alone never frees a GPU that is in use. Whatever still runs
        in the slots' cgroups (an engine the server did not stop) is killed before they
        are free."""
        spawner, owner = self.spawner, self.owner_key
        held = await off_loop(spawner.ledger.held_by, owner)
        if not held:
            return []
        holders = await off_loop(spawner.gpu_holders, held)
        if not holders:  # look again once no new open can succeed: one opened meanwhile shows now
            spawner.restrict_devices([])
            holders = await off_loop(spawner.gpu_holders, held)
            if holders:
                spawner.restrict_devices(held)
        if holders:
            kept = ", ".join(f"pid {pid} has {' '.join(nodes)}" for pid, nodes in sorted(holders.items()))
            if kept != self._kept_for:
                self.log.info("Kept %s for %s, whose lease says released: %s open; freed once none is",
                              ",".join(held), owner, kept)
            self._kept_for = kept
            return None
        self._kept_for = ""
        if await asyncio.to_thread(spawner.end_slot_processes, held):  # one would not die: the slots stay
            return None
        return await off_loop(spawner.ledger.reclaim, owner, spawner.reclaim_reason())

    async def take_back(self) -> list[str]:
        """The session's end (or GPUs held idle past their release), enforced: the device
        cgroup closes every GPU to this server's processes, those that hold one of its
        GPUs open anyway are killed, and its slots are freed (logged as a reclaim)."""
        spawner, owner = self.spawner, self.owner_key
        held = await off_loop(spawner.ledger.held_by, owner)
        if not held:
            return []
        spawner.restrict_devices([])
        for pid in await off_loop(spawner.gpu_holders, held):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(spawner.end_slot_processes, held)
        spawner.slots = []
        return await off_loop(spawner.ledger.reclaim, owner, spawner.reclaim_reason())

    async def grant_again(self, n: int) -> Grant:
        """Slots from the ledger again (the device cgroup follows them)."""
        spawner = self.spawner
        spawner.slots = await spawner.reserve_workers(n, spawning=False)
        spawner.restrict_devices(spawner.slots)
        await asyncio.to_thread(spawner.give_slot_cores, spawner.slots)
        self.log.info("Granted %s to %s again", ",".join(spawner.slots), self.owner_key)
        return Grant(workers=n, slots=tuple(spawner.slots))

    # -- GPU use --------------------------------------------------------------------------

    def _held_gpu_indexes(self) -> list[str] | None:
        """nvidia-smi's indexes of the whole GPUs this server holds; None without GPU
        slots or with a MIG slot."""
        slots = [parse_slot(slot) for slot in self.spawner.slots]
        indexes = [str(index) for kind, index in slots if kind == "gpu"]
        if not indexes or any(kind == "mig" for kind, _ in slots):
            return None
        return indexes

    async def gpu_use(self) -> list[float] | None:
        """Each held GPU's use in percent (``nvidia-smi`` on this machine, asked by the hub);
        None without GPU slots, with a MIG slot (nvidia-smi reads no use of a MIG device:
        the server's use is unknown), or when a held GPU has no reading."""
        indexes = self._held_gpu_indexes()
        if indexes is None:
            return None
        smi = self.spawner.nvidia_smi or None
        rows = await asyncio.to_thread(query_gpus, ("index", "utilization.gpu"), nvidia_smi=smi)
        use = {row["index"]: row["utilization.gpu"] for row in rows}
        try:
            return [float(use[index]) for index in indexes]
        except (KeyError, ValueError):  # a GPU not listed, or "[N/A]"
            return None

    async def gpu_memory(self) -> list[tuple[float, float]] | None:
        """Each held GPU's memory (used, in all) in bytes (``nvidia-smi``'s MiB); None as
        for :meth:`gpu_use` (a MIG slot's memory is its slice's: not read either)."""
        indexes = self._held_gpu_indexes()
        if indexes is None:
            return None
        rows = await asyncio.to_thread(query_gpus, ("index", "memory.used", "memory.total"),
                                       nvidia_smi=self.spawner.nvidia_smi or None)
        memory = {row["index"]: (row["memory.used"], row["memory.total"]) for row in rows}
        try:
            return [(float(memory[i][0]) * MIB, float(memory[i][1]) * MIB) for i in indexes]
        except (KeyError, ValueError):  # a GPU not listed, or "[N/A]"
            return None

    async def record_gpu_idle(self, since: float | None) -> None:
        """The flag, in the ledger, where the admin view reads it."""
        await off_loop(self.spawner.ledger.flag_gpu_idle, self.owner_key, since)
