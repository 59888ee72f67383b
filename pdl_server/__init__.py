"""The user's server: what runs between the hub and the engines, as the user.

- :mod:`pdl_server.singleuser`: ``pdl-singleuser``, the server supervisor: the
  Jupyter server, the ipyparallel controller and the engines, kept running and
  released when idle (the engine lease, :mod:`pdl.lease`).
- :mod:`pdl_server.jupyter_process`: the Jupyter server's process, started without
  JupyterLab's node calls for yarn's registry.
- :mod:`pdl_server.session_clock`: the end of the server's session (Slurm: its job's
  time limit), the warning before it and the release just before it.
- :mod:`pdl_server.engine_hosts`: the engine host's protocol, and the one its kind's
  plug-in names (``PDL_KIND``), chosen once from the contract.
- :mod:`pdl_server.clusters`: the engine launcher: the user's ipyparallel controller
  and engines, started by the supervisor and reached by the kernel;
  :mod:`pdl_server.warm_engines`: engines forked from a warm parent that has imported
  torch and ipyparallel once; :mod:`pdl_server.launcher_thread`: the one thread they are
  all started from.
- :mod:`pdl_server.lease_owner`: the one owner of the server's engine lease, in its
  Jupyter server; :mod:`pdl_server.lease_api`: its HTTP API (a Jupyter server
  extension), through which the hub, the supervisor and kernels reach it;
  :mod:`pdl_server.lease_client`: the supervisor's and a kernel's side of that API.
- :mod:`pdl_server.entry_gate`: strangers get the hub's answer for a stopped server, so
  that no visitor can tell who is working now; :mod:`pdl_server.secure_cookies`: over
  https, the server's own cookies are Secure too.
- :mod:`pdl_server.status_file`: what the kernel runs, written for the Cluster panel.
- :mod:`pdl_server.world`: the ranks of a cell (their order, results, the engine
  call), shared by the kernel and the panel.

It imports only :mod:`pdl` (the shared floor); the notebook side (:mod:`pdl_magics`)
and the panel (:mod:`pdl_lab`) build on it. The server contract, everything a spawner
tells a user's server, is :mod:`pdl.contract`; the engine contract, everything an
engine is told, :mod:`pdl.engine_contract`.
"""


def _jupyter_server_extension_points():
    return [{"module": "pdl_server.lease_api"}, {"module": "pdl_server.entry_gate"},
            {"module": "pdl_server.secure_cookies"}]
