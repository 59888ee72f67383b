"""CINIC-10 for PDL notebooks: load the official PNG layout, shard it across
ranks, and train a CIFAR-style ResNet-18 with torch.distributed (DDP) or Horovod.

Importing this package is cheap (no torch); the heavy modules are
``pdl_cinic10.data``, ``.model`` and ``.train``.

- :mod:`pdl_cinic10.layout`: where CINIC-10 lives on disk (no torch);
  :mod:`pdl_cinic10.download`: fetch, verify and unpack the official archive;
  :mod:`pdl_cinic10.sample`: a small synthetic dataset in the same layout (smoke tests);
  :mod:`pdl_cinic10.digits`: real images in that layout with nothing downloaded
  (scikit-learn's handwritten digits), for tests and benchmarks on real data.
- :mod:`pdl_cinic10.data`: load splits into tensors and shard them across ranks;
  :mod:`pdl_cinic10.cache`: a compact per-node cache of them.
- :mod:`pdl_cinic10.model`: the CIFAR-style ResNet-18.
- :mod:`pdl_cinic10.recipe`: the settings (``Hyper``) and the rule that derives them
  from the data's size and the world size (no torch).
- :mod:`pdl_cinic10.train`: the data-parallel training loop, with
  :mod:`pdl.collectives` from torch.distributed or Horovod, and
  :mod:`pdl_cinic10.compile_support`: whether ``torch.compile`` can run on a GPU here.
"""

CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
"""Official class names; a label is the index into this tuple."""

SPLITS = ("train", "valid", "test")
"""Official split folder names."""

IMAGE_SIZE = 32
"""Every CINIC-10 image is IMAGE_SIZE x IMAGE_SIZE RGB."""

ARCHIVE_URL = "https://datashare.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz"
ARCHIVE_MD5 = "6ee4d0c996905fe93221de577967a372"

__all__ = ["CLASSES", "SPLITS", "IMAGE_SIZE", "ARCHIVE_URL", "ARCHIVE_MD5"]
