"""The training recipe: its settings (:class:`Hyper`) and the one rule that derives
them from the data's size and the world size (:meth:`Hyper.for_data`).

No torch here: the rule is plain arithmetic, imported cheaply by the notebook and the
benchmarks. :func:`pdl_cinic10.train.fit` applies the same bounds (:func:`peak_lr`,
:func:`warmup_steps`) to any Hyper, so hand-set values stay safe too.

Why each bound (measured on real images, ``docs/benchmarks.md``, "The recipe on real
images"): a global batch near the data's size gives 2 steps an epoch and a warmup of
2 steps, and training diverges (loss 2.4, 4.0, 4.5, accuracy at chance for 15
epochs); at least :data:`MIN_STEPS_PER_EPOCH` steps an epoch, a warmup of at least
:data:`WARMUP_MIN_STEPS` steps, and a learning rate scaled to the global batch only
within :data:`LR_SCALE` train the same images to 98 % in 5 to 6 epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

__all__ = ["Hyper", "global_batch", "peak_lr", "warmup_steps", "width_for", "epochs_for",
           "MIN_STEPS_PER_EPOCH", "MIN_BATCH_PER_RANK", "MAX_GLOBAL_BATCH", "LR_SCALE",
           "WARMUP_MIN_STEPS", "MIN_TOTAL_STEPS"]

#: Optimizer steps an epoch the chosen global batch leaves at least (data permitting).
MIN_STEPS_PER_EPOCH = 32
#: Images a rank takes a step at least (BatchNorm's statistics are per rank).
MIN_BATCH_PER_RANK = 8
#: Largest global batch the rule chooses (images a step, all ranks together).
MAX_GLOBAL_BATCH = 512
#: Bounds of the factor global batch / 256 that scales ``Hyper.lr``: linear scaling
#: inside, held at the bound outside (a tiny batch still learns at a useful rate; a
#: huge one does not get a rate that diverges).
LR_SCALE = (0.25, 2.0)
#: Warmup steps at least, however short an epoch (and at most half of all steps).
WARMUP_MIN_STEPS = 20
#: Optimizer steps of a whole run at least: small data gets more epochs.
MIN_TOTAL_STEPS = 400
#: Epochs the rule gives data large enough to reach MIN_TOTAL_STEPS sooner.
DEFAULT_EPOCHS = 15
#: ResNet-18 widths by training-set size: (images at most, width); above the last, 64.
WIDTHS = ((20_000, 16), (60_000, 32))


@dataclass
class Hyper:
    """All hyperparameters in one place.

    ``batch_size`` is images per rank per step; ``lr`` is the peak rate for a
    global batch of 256, scaled by (batch_size * world size) / 256 bounded to
    :data:`LR_SCALE` (:func:`peak_lr`); ``warmup_epochs`` may be fractional and is
    counted in steps, at least :data:`WARMUP_MIN_STEPS` (:func:`warmup_steps`);
    ``width`` is for ``ResNet18(width=...)``, which the caller builds; ``seed``
    drives shuffling and augmentation.
    On a GPU, ``bf16`` runs forward and backward under bfloat16 autocast,
    ``channels_last`` stores activations NHWC, and ``compile`` wraps the model
    in ``torch.compile`` (on a CPU these three are off: they do not pay there).
    ``compile`` is off by default: on an H100 it cost 25 to 50 s of compiling and
    then trained no faster (CINIC-10-sized data, batch 512: 2.6 to 2.9 s an epoch
    either way), so it only delayed every accuracy (``docs/benchmarks.md``).
    ``tta`` scores test images as the mean of the image's and its mirror's logits.

    The defaults suit CINIC-10's 90,000 images on one rank; :meth:`for_data` gives
    the values for any data and world size.
    """

    epochs: int = DEFAULT_EPOCHS
    batch_size: int = 256
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1
    width: int = 64
    seed: int = 0
    bf16: bool = True
    channels_last: bool = True
    compile: bool = False
    tta: bool = True

    @classmethod
    def for_data(cls, n_train: int, world_size: int, **overrides) -> Hyper:
        """The recipe for ``n_train`` training images on ``world_size`` ranks.

        ``batch_size`` from :func:`global_batch`, ``width`` from :func:`width_for`,
        ``epochs`` from :func:`epochs_for`; the rest as the class's defaults. Keyword
        ``overrides`` (any field; ints and floats may come as text, e.g. from the
        environment) replace what the rule chose; None leaves it. ValueError, in one
        line naming the fields, for an unknown field or a value of the wrong kind.
        """
        if n_train < 1 or world_size < 1:
            raise ValueError(f"n_train and world_size must be >= 1; got {n_train}, {world_size}")
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise ValueError(f"unknown setting {', '.join(unknown)}; use {', '.join(names)}")
        batch = global_batch(n_train, world_size) // world_size
        chosen = cls(batch_size=batch, width=width_for(n_train),
                     epochs=epochs_for(n_train, world_size, batch))
        given = {}
        for name, value in overrides.items():
            if value is None:
                continue
            kind = type(getattr(chosen, name))
            try:
                given[name] = _as(kind, value)
            except ValueError:
                raise ValueError(f"{name} must be {kind.__name__}; got {value!r}") from None
        return replace(chosen, **given)


def _as(kind: type, value):
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes"):
            return True
        if str(value).lower() in ("0", "false", "no"):
            return False
        raise ValueError(value)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return kind(value)


def global_batch(n_train: int, world_size: int) -> int:
    """Images a step, all ranks together: the largest power of two that leaves
    :data:`MIN_STEPS_PER_EPOCH` steps an epoch, at most :data:`MAX_GLOBAL_BATCH`,
    and at least :data:`MIN_BATCH_PER_RANK` a rank; always a multiple of ``world_size``."""
    fits = max(1, n_train // MIN_STEPS_PER_EPOCH)
    batch = min(MAX_GLOBAL_BATCH, 2 ** int(math.log2(fits)))
    per_rank = max(MIN_BATCH_PER_RANK, batch // world_size)
    return per_rank * world_size


def peak_lr(lr: float, global_batch_size: int) -> float:
    """The peak learning rate for ``lr`` per 256 images: scaled linearly to the
    global batch, with the factor held inside :data:`LR_SCALE`."""
    low, high = LR_SCALE
    return lr * min(high, max(low, global_batch_size / 256))


def warmup_steps(warmup_epochs: float, steps_per_epoch: int, total_steps: int) -> int:
    """Steps of linear warmup: ``warmup_epochs`` of steps, at least
    :data:`WARMUP_MIN_STEPS`, at most half of ``total_steps``."""
    return min(max(WARMUP_MIN_STEPS, round(warmup_epochs * steps_per_epoch)), total_steps // 2)


def width_for(n_train: int) -> int:
    """ResNet-18's width for a training set of ``n_train`` images (:data:`WIDTHS`):
    a small network for small data, the standard 64 from CINIC-10's size on."""
    return next((width for most, width in WIDTHS if n_train <= most), 64)


def epochs_for(n_train: int, world_size: int, batch_per_rank: int) -> int:
    """:data:`DEFAULT_EPOCHS`, or more when they would give fewer than
    :data:`MIN_TOTAL_STEPS` optimizer steps."""
    largest_share = -(-n_train // world_size)  # ceil: the rank with the most images
    steps = -(-largest_share // batch_per_rank)
    return max(DEFAULT_EPOCHS, -(-MIN_TOTAL_STEPS // steps))
