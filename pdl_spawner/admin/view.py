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


def source(settings: dict) -> tuple[Callable[[], dict], PageParts]:
    """The reader and page parts of the kind ``settings["kind"]`` names, given the rest
    of ``settings``; ValueError (one line) for a kind that is not registered. With
    ``settings["usage_db"]`` (the hub's usage book), the status also has ``usage``
    (:func:`pdl_spawner.hub.usage_book.summary_rows`), which every page shows."""
    settings = dict(settings)
    module = kind_named(settings.pop("kind")).admin_module()
    usage_db = settings.pop(USAGE_SETTING, None)
    read = module.reader(settings)
    if not usage_db:
        return read, module.PAGE

    def read_with_usage() -> dict:
        status = read()
        return {**status, "usage": summary_rows(UsageBook(usage_db), time.time())}

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
