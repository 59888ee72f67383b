"""Balanced batches for ranks of unequal speed: one global batch per step, each rank's
share sized so that all finish together (user API: :func:`balanced_batches`).

- :mod:`pdl.balance.plan`: the split, from each rank's fitted step time, and the mode
  ``%%distributed --balance`` sets (pure, no torch);
- :mod:`pdl.balance.batches`: each epoch's steps on one rank, micro-batches past its
  memory, the loss weights that keep the gradient the global batch's mean, and
  rebalancing when the measured times drift;
- :mod:`pdl.balance.pace`: whether the ranks' step times differ beyond the machine's
  noise (pure, no torch);
- :mod:`pdl.balance.helper`: :func:`balanced_batches` and the probe of each rank's speed.

Importing this package is cheap (no torch): :func:`balanced_batches` is imported when
first used.

Example, in a ``%%distributed`` cell (DDP; Horovod alike, passing ``optimizer``)::

    batches = pdl.balanced_batches(len(x), global_batch=256, seed=0,
                                   probe=lambda b: loss_fn(net.module(x[:b]), y[:b]).backward())
    for epoch in range(epochs):
        for step in batches.epoch(epoch):
            optimizer.zero_grad()
            for part in step.parts(net):
                part.scaled(loss_fn(net(x[part.indices]), y[part.indices])).backward()
            optimizer.step()
"""


def __getattr__(name: str):
    if name == "balanced_batches":
        from pdl.balance.helper import balanced_batches

        return balanced_batches
    raise AttributeError(f"module 'pdl.balance' has no attribute {name!r}")
