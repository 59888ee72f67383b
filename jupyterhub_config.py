"""JupyterHub configuration for PDL: the embedded default (one machine, local engines),
or the lab's cluster (``PDL_SPAWNER=swarm`` or ``slurm``).

Start with ``jupyterhub -f jupyterhub_config.py`` (``scripts/serve`` does it all). The
hub reads its ``PDL_*`` environment variables, each checked (a bad value, or a variable
that is no setting of this hub's kind, stops it with one line naming what is valid), and
then the admin's own file of ``c.*`` settings, ``/etc/pdl/hub_config.py`` or
``PDL_LOCAL_CONFIG``, whose settings win. docs/admin.md, "Every setting, in one place",
lists every variable with its default (the table of
:mod:`pdl_spawner.settings.variables` and each kind's); docs/settings.md every ``c.*``
setting. What the variables do is :mod:`pdl_spawner.settings.hub_config`.
"""

import os
from pathlib import Path

from pdl_spawner.settings.hub_config import configure

c = get_config()  # noqa: F821 - provided by JupyterHub

configure(c, os.environ, load_subconfig, Path(__file__).resolve().parent)  # noqa: F821 - the loader's
