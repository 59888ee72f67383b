"""The user's Jupyter server process: ``python -m pdl_server.jupyter_process MODULE [ARGS...]``
runs the Jupyter server module ``MODULE`` (``jupyterhub.singleuser`` under the hub,
:mod:`pdl_server.singleuser`) as ``python -m MODULE ARGS...`` would, with one thing
left out.

JupyterLab runs ``node yarn.js config --json`` when it is imported and again for its
server's option set (about 0.3 CPU-s and 0.8 s each on a machine of CI's kind), only to
learn yarn's package registry, which only a build of source extensions in a running Lab
uses; a user's server never builds (the Lab's application folder is the installation's).
Here JupyterLab is given yarn's and npm's defaults without running node, the answer it
gives itself where node is not installed (:func:`leave_out_yarn_config`, before
JupyterLab is imported). ``jupyter lab build`` and every other process still ask yarn.
"""

from __future__ import annotations

import runpy
import sys


def _yarn_defaults(logger) -> dict:
    """JupyterLab's answer where node is not installed: yarn's and npm's defaults."""
    return {"yarn config": {}, "npm config": {}}


def leave_out_yarn_config() -> None:
    """From now on, this process's JupyterLab learns yarn's defaults without running node
    (nothing where JupyterLab is not installed)."""
    try:
        import jupyterlab.commands
    except ImportError:
        return
    jupyterlab.commands._yarn_config = _yarn_defaults


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit("usage: python -m pdl_server.jupyter_process MODULE [ARGS...] "
                 "(MODULE: a Jupyter server's module, e.g. jupyterhub.singleuser)")
    leave_out_yarn_config()
    module, sys.argv = argv[0], argv
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
