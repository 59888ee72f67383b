"""The admin view's source for the embedded default (:class:`~pdl_spawner.local.PDLLocalSpawner`).

The holdings are the slot ledger's, a SQLite file
(:class:`~pdl_spawner.core.reservations.SlotLedger`), on this machine; the queue
(:class:`~pdl_spawner.core.wait_queue.WaitQueue`) and the recent reclaims live in the
same file. Its settings (:func:`reader`) come from the hub's final config
(:func:`pdl_spawner.local.kind.admin_settings`): the ledger file, the pool and the
nvidia-smi that names the GPUs' types, as the spawner has them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pdl.slots import default_pool, holds_gpu, slot_index, slot_types
from pdl_spawner.admin.frame import (
    RECENT_RECLAIMS, PageParts, gpu_idle_rows, gpu_idle_section, holdings_sections, iso_utc, queue_rows, reclaim_rows,
    reservation_row, split_owner,
)
from pdl_spawner.core.reservations import Holding, Reclaim, SlotLedger
from pdl_spawner.core.wait_queue import Waiter, WaitQueue


def reservation_rows(holdings: list[Holding], node: str, now: float,
                     slot_types: dict[str, str] | None = None) -> list[dict]:
    """One row per reserved slot (:func:`~pdl_spawner.admin.frame.reservation_row`),
    in slot order, ``node`` the machine the slot is on, ``gpu_type`` its type where
    ``slot_types`` names one (else ""); ``now`` is epoch seconds."""
    ordered = sorted(holdings, key=lambda h: (h.slot.partition(":")[0], slot_index(h.slot), h.slot))
    types = slot_types or {}
    return [{**reservation_row(h.slot, node, h.owner, split_owner(h.owner)[0], h.since, now),
             "gpu_type": types.get(h.slot, "")} for h in ordered]


def status_model(
    holdings: list[Holding], waiters: list[Waiter], reclaims: list[Reclaim], *,
    node: str, pool: list[str] | None, now: float, gpu_idle: dict[str, float] | None = None,
    slot_types: dict[str, str] | None = None,
) -> dict:
    """Everything the view shows, JSON-ready: ``source`` (``"local"``), ``node`` (this
    machine's hostname), ``now`` (ISO UTC), ``pool`` and ``free`` (slot names; None when
    the pool is not known), and the rows of :func:`reservation_rows`,
    :func:`~pdl_spawner.admin.frame.queue_rows` and
    :func:`~pdl_spawner.admin.frame.reclaim_rows` as ``reservations``, ``queue``
    and ``reclaims``, and the flags on GPUs held idle (``gpu_idle``: owner -> since) as
    the rows of :func:`~pdl_spawner.admin.frame.gpu_idle_rows`, ``gpu_idle``.
    ``slot_types``: GPU slot -> its type, for the reservations. ``now`` is epoch seconds."""
    held = {h.slot for h in holdings}
    return {
        "source": "local",
        "node": node,
        "now": iso_utc(now),
        "pool": list(pool) if pool is not None else None,
        "free": [s for s in pool if s not in held] if pool is not None else None,
        "reservations": reservation_rows(holdings, node, now, slot_types),
        "queue": queue_rows(waiters, now),
        "reclaims": reclaim_rows(reclaims),
        "gpu_idle": gpu_idle_rows(gpu_idle or {}, now),
    }


def summary(status: dict) -> tuple[str, str]:
    """The summary line: this machine, and its free slots."""
    if status["pool"] is None:
        return f"Node {status['node']}", f"{len(status['reservations'])} slot(s) reserved"
    return f"Node {status['node']}", f"{len(status['free'])} of {len(status['pool'])} slot(s) free"


#: The local source's part of the page.
PAGE = PageParts(summary=summary, sections=lambda status: holdings_sections(
    status, "Slot", "No slot is reserved.", "No slot was reclaimed.") + "\n" + gpu_idle_section(status))


def read_status(db_path: str | Path, *, node: str, pool: list[str] | None, nvidia_smi: str = "") -> dict:
    """:func:`status_model` for the ledger (and queue) file ``db_path``, now; the GPUs'
    types from ``nvidia_smi`` ("" : the one on PATH) where the pool has GPU slots."""
    ledger = SlotLedger(db_path)
    types = slot_types(nvidia_smi or None) if any(map(holds_gpu, pool or [])) else {}
    return status_model(
        ledger.holdings(), WaitQueue(db_path).waiters(), ledger.reclaims(RECENT_RECLAIMS),
        node=node, pool=pool, now=time.time(), gpu_idle=ledger.gpu_idle_flags(), slot_types=types,
    )


def reader(settings: dict) -> Callable[[], dict]:
    """The local reader, from :func:`pdl_spawner.local.kind.admin_settings`: the ledger
    ``reservations_db``, the spawner's ``pool`` (None: its default, every GPU, else
    ``cpu_slots`` CPU slots) and the GPUs' types read with ``nvidia_smi``."""
    pool = settings.get("pool") or default_pool(settings.get("cpu_slots"))
    return partial(read_status, settings["reservations_db"], node=socket.gethostname(), pool=list(pool),
                   nvidia_smi=settings.get("nvidia_smi") or "")
