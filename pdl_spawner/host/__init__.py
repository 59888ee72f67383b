"""The user's server as processes of their own Unix account on the hub's machine (the
local and Slurm kinds' server part), and the bounds the hub puts around them (as root).

- :mod:`pdl_spawner.host.server`: the server as a local process tree
  (:class:`~pdl_spawner.host.server.HostServer`); :mod:`pdl_spawner.host.workers`: what
  its kinds' sources of workers share; :mod:`pdl_spawner.host.listening`: when a
  started server first accepts connections, so the hub sees it at once.
- :mod:`pdl_spawner.host.device_cgroup`: per-server GPU device isolation and process
  tracking; :mod:`pdl_spawner.host.port_filter`: which ports of the hub's range a
  server may bind (its own); :mod:`pdl_spawner.host.bpf`: eBPF programs on cgroups,
  by the bpf() syscall (for the two above).
- :mod:`pdl_spawner.host.private_tmp`: each server's own /tmp, /var/tmp and /dev/shm;
  :mod:`pdl_spawner.host.private_ipc`: its own System V IPC and abstract Unix sockets.
- :mod:`pdl_spawner.host.account_limits`: the processes and memory each user may have,
  and an OOM score they cannot lower;
  :mod:`pdl_spawner.host.cpu_limits`: the CPU each server may take, each engine kept on
  its slot's cores and ended with the slot; :mod:`pdl_spawner.host.cgroup_v2`: the same
  bounds on hosts with cgroup v2 only.
"""
