"""PDL core: the user API (``import pdl``) and what every side shares.

The user API, stable for notebooks:

- :mod:`pdl.metrics`: :func:`log`, training metrics the notebook shows live.
- :mod:`pdl.checkpoint`: :func:`save_checkpoint` (atomic, rank 0 writes) and
  :func:`load_checkpoint` (``weights_only``, rank 0 reads and broadcasts), to
  resume training after an interrupt or an engine's death.
- :mod:`pdl.balance`: :func:`balanced_batches`, each step's global batch split over
  ranks of unequal speed so that they finish together.
- :mod:`pdl.collectives`: the few collectives a training loop needs, from
  torch.distributed or Horovod.
- :mod:`pdl.scaling`: what more nodes or a faster link would do to a step (the
  model ``%pdl scale`` prints).

Shared by the hub side, the notebook side and the engines:

- :mod:`pdl.slots`: the machine's pool of worker slots (GPUs, or CPU shares) and
  the environment that pins one engine to one slot.
- :mod:`pdl.nvidia_smi`: the GPUs ``nvidia-smi`` lists, asked in one place.
- :mod:`pdl.netaddr`: the address and interface peers on other machines reach.
- :mod:`pdl.connection`: the keys, ports and files of a controller whose engines run
  on other machines (Docker Swarm).
- :mod:`pdl.process`: whether a local process is alive.
- :mod:`pdl.entry_ticket` and :mod:`pdl.hub_relay`: the hub's word that a browser may
  begin a login at a user's server, and the one path by which a stranger's request at a
  user's origin gets the hub's answer (the hub and the user's server both take it).
- :mod:`pdl.atomic_file`: write a file that readers see whole or not at all.
- :mod:`pdl.line_fit`: the least-squares line through measured points (a rank's
  speed, a link's).
- :mod:`pdl.limits`: the line that tells a user their limit and what they hold (the
  spawn form and the Cluster panel).
- :mod:`pdl.memory_limit`: the memory limit the user's account runs under, and whether
  the OOM killer ended one of its processes (a rank's one line in the notebook).
- :mod:`pdl.contract`: the server contract, everything a spawner tells a user's
  server (and the server its kernels), built and parsed in one place.
- :mod:`pdl.engine_contract`: the engine contract, everything an engine is told
  about its place in the reservation, built and parsed in one place.
- :mod:`pdl.engine_channel`: what a rank tells the notebook beside its output while a
  cell runs (the published data's keys, the signal that asks for its stack).
- :mod:`pdl.lease`: the engine lease's typed messages (release, want, grant,
  refusal), their one writer and reader, and the files a server keeps them in.

The code that runs inside each engine is the subpackage :mod:`pdl.runtime`.
"""

from pdl.metrics import log

__all__ = ["log", "save_checkpoint", "load_checkpoint", "balanced_batches"]
__version__ = "0.1.0"

#: Exported lazily: ``import pdl`` stays free of torch (the hub side imports it too).
_CHECKPOINT_API = {"save_checkpoint": "save", "load_checkpoint": "load"}


def __getattr__(name: str):
    if name in _CHECKPOINT_API:
        from pdl import checkpoint

        return getattr(checkpoint, _CHECKPOINT_API[name])
    if name == "balanced_batches":
        from pdl.balance.helper import balanced_batches

        return balanced_batches
    raise AttributeError(f"module 'pdl' has no attribute {name!r}")
