"""PDL in JupyterLab: the server side of the "Cluster" panel.

A Jupyter server extension (enabled by ``etc/jupyter/jupyter_server_config.d/pdl.json``,
which ``pip install`` puts in place) serving ``/pdl/api/...``
(:mod:`pdl_lab.handlers`) from a :class:`~pdl_lab.monitor.ClusterMonitor`, which
reads engines' CPU, memory and GPU use through :mod:`pdl_lab.resources`. The
panel itself is the prebuilt JupyterLab extension ``pdl-cluster``, built from
``labextension/`` into ``share/jupyter/labextensions/pdl-cluster``. The extension also
watches the server's kernels (:mod:`pdl_lab.kernel_ends`): one that the user's memory
limit ended is named so in its successor's first cell.
"""

from __future__ import annotations

import atexit


def _jupyter_server_extension_points():
    return [{"module": "pdl_lab"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from . import kernel_ends
    from .handlers import setup_handlers
    from .monitor import ClusterMonitor

    monitor = ClusterMonitor()
    setup_handlers(serverapp.web_app, monitor)
    atexit.register(monitor.close)
    kernel_ends.watch(serverapp)
    mode = f"hub cluster {monitor.hub_cluster_file}" if monitor.hub_cluster_file else "local sessions"
    serverapp.log.info(f"pdl_lab: Cluster panel API at /pdl/api/ ({mode})")
