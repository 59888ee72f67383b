"""The admin view: who holds which slot or GPU, who waits in the queue, what was reclaimed,
and the worker-hours of this week and month.

A JupyterHub managed service, ``pdl-admin`` (registered by
:mod:`pdl_spawner.settings.hub_config`), run by the hub as ``python -m
pdl_spawner.admin.view``: the page and its JSON API (:mod:`pdl_spawner.admin.frame`)
over the source of the hub's cluster kind. The hub tells it which, and that source's
settings, in one variable, ``PDL_ADMIN_SOURCE``: JSON ``{"kind": <name>, ...}``; the
kind's plug-in (:mod:`pdl_spawner.kinds`) names its source module, whose
``reader(settings)`` reads the status and whose ``PAGE`` draws it.

``PDL_ADMIN_VIEW_PORT`` (read by the hub's config, not here) is the port on 127.0.0.1
in the service's URL, default 8002; the service listens where ``$JUPYTERHUB_SERVICE_URL`` says.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from pdl_spawner.admin.frame import PageParts, serve
from pdl_spawner.admin.frame import render_page as render_with
from pdl_spawner.hub.usage_book import UsageBook, summary_rows
from pdl_spawner.kinds import kind_named, kinds

#: The variable the hub passes the source's settings in (as JSON).
SOURCE_VARIABLE = "PDL_ADMIN_SOURCE"
#: The setting naming the hub's usage book (:mod:`pdl_spawner.hub.usage_book`).
USAGE_SETTING = "usage_db"
#: The file in the hub's state folder that keeps the same settings, for ``pdl-usage``
#: (written by the hub's config at each start; mode 0600).
SETTINGS_FILE = "admin-source.json"


def usage_source(settings: dict):
    """Where the usage report of the hub these settings describe comes from (an object
    with ``report(since, until)``, as :class:`~pdl_spawner.hub.usage_book.UsageBook`)
    where they name the hub's usage book (``settings["usage_db"]``; None where not):
    the kind's own (its admin source's ``usage_source(settings)``, e.g. Slurm's
    accounting), else that book."""
    settings = dict(settings)
    module = kind_named(settings.pop("kind")).admin_module()
    usage_db = settings.pop(USAGE_SETTING, None)
    if not usage_db:
        return None
    if hasattr(module, "usage_source"):
        return module.usage_source(settings)
    return UsageBook(usage_db)


def source(settings: dict) -> tuple[Callable[[], dict], PageParts]:
    """The reader and page parts of the kind ``settings["kind"]`` names, given the rest
    of ``settings``; ValueError (one line) for a kind that is not registered. Where the
    hub has a usage report (:func:`usage_source`), the status also has ``usage``
    (:func:`pdl_spawner.hub.usage_book.summary_rows`), which every page shows, or
    ``usage_error`` (one line) when it cannot be read."""
    usage = usage_source(settings)
    settings = dict(settings)
    module = kind_named(settings.pop("kind")).admin_module()
    settings.pop(USAGE_SETTING, None)
    read = module.reader(settings)
    if usage is None:
        return read, module.PAGE

    def read_with_usage() -> dict:
        status = read()
        try:
            return {**status, "usage": summary_rows(usage, time.time())}
        except (OSError, RuntimeError, ValueError) as e:  # Slurm's SlurmError is a RuntimeError
            return {**status, "usage_error": f"worker-hours unreadable: {e}"}

    return read_with_usage, module.PAGE


def reader(settings: dict) -> Callable[[], dict]:
    """The status reader of :func:`source`."""
    return source(settings)[0]


def render_page(status: dict) -> str:
    """The admin page of any kind's status model (by its ``source``, the kind's name)."""
    return render_with(status, kind_named(status["source"], kinds()).admin_module().PAGE)


def main() -> None:
    """Serve until the hub stops the service; never outlive the hub (even after ``kill -9``)."""
    serve(*source(json.loads(os.environ[SOURCE_VARIABLE])))


if __name__ == "__main__":
    main()
