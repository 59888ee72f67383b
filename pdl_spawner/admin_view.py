"""The admin view: who holds which slot or GPU, who waits in the queue, what was reclaimed.

A JupyterHub managed service, ``pdl-admin`` (registered in ``jupyterhub_config.py``),
run by the hub as ``python -m pdl_spawner.admin_view``: the page and its JSON API
(:mod:`pdl_spawner.core.admin_frame`) over the source of the hub's cluster kind, chosen
from the environment the service definition sets:

- Slurm (``PDL_SLURM=1``): :mod:`pdl_spawner.slurm.admin_source`;
- Swarm (``PDL_DOCKER_HOST`` set): :mod:`pdl_spawner.swarm.admin_source`;
- otherwise the embedded default: :mod:`pdl_spawner.local.admin_source`.

``PDL_ADMIN_VIEW_PORT`` (read by ``jupyterhub_config.py``, not here) is the port on
127.0.0.1 in the service's URL, default 8002; the service listens where
``$JUPYTERHUB_SERVICE_URL`` says.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pdl_spawner.core.admin_frame import PageParts, serve
from pdl_spawner.core.admin_frame import render_page as render_with
from pdl_spawner.local import admin_source as local_source
from pdl_spawner.slurm import admin_source as slurm_source
from pdl_spawner.swarm import admin_source as swarm_source

#: Each kind's page parts, by the ``source`` its status model names.
PAGES = {"local": local_source.PAGE, "swarm": swarm_source.PAGE, "slurm": slurm_source.PAGE}


def source_from_env(env=os.environ) -> tuple[Callable[[], dict], PageParts]:
    """The reader and page parts of the kind the environment names: Slurm when
    ``PDL_SLURM`` is ``1``, else Swarm when ``PDL_DOCKER_HOST`` is set, else local."""
    if env.get("PDL_SLURM") == "1":
        return slurm_source.reader_from_env(env), slurm_source.PAGE
    if env.get("PDL_DOCKER_HOST"):
        return swarm_source.reader_from_env(env), swarm_source.PAGE
    return local_source.reader_from_env(env), local_source.PAGE


def reader_from_env(env=os.environ) -> Callable[[], dict]:
    """The status reader of :func:`source_from_env`."""
    return source_from_env(env)[0]


def render_page(status: dict) -> str:
    """The admin page of any kind's status model (by its ``source``)."""
    return render_with(status, PAGES[status["source"]])


def main() -> None:
    """Serve until the hub stops the service; never outlive the hub (even after ``kill -9``)."""
    serve(*source_from_env())


if __name__ == "__main__":
    main()
