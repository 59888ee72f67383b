"""The user's server: what runs between the hub and the engines, as the user.

- :mod:`pdl_server.contract`: the server contract, everything a spawner tells a
  user's server (and the server its kernels), built and parsed in one place.
- :mod:`pdl_server.singleuser`: ``pdl-singleuser``, the server supervisor: the
  Jupyter server, the ipyparallel controller, one engine per reserved slot.
- :mod:`pdl_server.lease`: the engine lease, idle engines giving their slots back
  and asking for them again, in files only the server writes.
- :mod:`pdl_server.step_guard`: the task of a Slurm step that runs a server inside
  its job; it ends the step with the server, stopping whatever the server left.

The Cluster panel's HTTP API, through which the hub reads and answers the lease,
is served by :mod:`pdl_lab.handlers`.
"""
