"""The engine runtime: the code that runs inside each ipyparallel engine (and its
controller), never in the hub or the notebook's kernel.

- :mod:`pdl.runtime.engine`: the functions the notebook calls by name
  (:func:`pdl_server.world.call_engine`): forming the process group, running a cell,
  aborting a group.
- :mod:`pdl.runtime.interrupts`: Ctrl-C reaches the user's code in a cell, never PDL's
  own steps around it.
- :mod:`pdl.runtime.identity`: who this engine is (host, address, pid, slot).
- :mod:`pdl.runtime.group_sockets`: the sockets of the process group, cut on demand.
- :mod:`pdl.runtime.peer_routes`: whether this rank reaches its peers' addresses yet,
  asked before a group connects across hosts.
- :mod:`pdl.runtime.horovod_group`: joining a Horovod world the kernel set up.
- :mod:`pdl.runtime.preflight`: what this rank runs on, and the all-reduce smoke test.
- :mod:`pdl.runtime.stacks`: this rank's Python stack on request (the hang watchdog).
- :mod:`pdl.runtime.scale_probe`: what ``%pdl scale`` measures on a rank (the step
  without communication, the gradient's bytes, an all-reduce sweep between nodes).
- :mod:`pdl.runtime.boot`: the engine and controller process entry point (pinned to
  its slot, dies with its parent, no new privileges).
- :mod:`pdl.runtime.warm_parent`: the warm parent the engines of a server are forked
  from, after it imported torch and ipyparallel once.
"""
