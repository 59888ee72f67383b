"""A compact uint8 cache of CINIC-10 splits, built once per node and loaded whole.

Decoding 270,000 PNGs takes minutes; reading one array takes a second. The
first :func:`load` of a split decodes its PNGs in parallel worker processes and
writes, next to each other in the cache folder:

- ``<split>.images.npy``: uint8 [N, 3, 32, 32] (RGB, class then file name order),
- ``<split>.labels.npy``: int64 [N], indices into :data:`pdl_cinic10.CLASSES`,
- ``<split>.json``: the manifest: N, the SHA-256 of both arrays, and a
  fingerprint of the PNG folder (names, sizes, modification times).

The manifest is written last, and every file is renamed into place, so a reader
never sees half a cache. Builders of one split take a file lock, so concurrent
ranks on a node build it once and the others wait and reuse it. A cache whose
checksums do not match (a torn copy, a flipped bit) or whose source folder
changed is rebuilt, with a warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from pdl.atomic_file import write_atomic

from . import IMAGE_SIZE, SPLITS
from .data import decode_files, split_files

__all__ = ["load", "cache_dir_for", "build", "verify", "CacheWarning"]

FORMAT = 1
"""Bumped when the files' layout changes; a cache of another format is rebuilt."""


class CacheWarning(UserWarning):
    """A cache was found corrupt or stale and is being rebuilt."""


def cache_dir_for(root: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the cache of dataset ``root`` lives.

    ``cache_dir`` if given, else ``$CINIC10_CACHE``, else
    ``~/.cache/pdl/cinic10/<name>-<hash of root's absolute path>``. Every rank
    on a node that uses the same folder shares one cache.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("CINIC10_CACHE"):
        return Path(os.environ["CINIC10_CACHE"]).expanduser()
    resolved = Path(root).expanduser().resolve()
    tag = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "pdl" / "cinic10" / f"{resolved.name}-{tag}"


def load(
    root: str | os.PathLike,
    split: str,
    *,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` of ``split`` on ``device``, from the cache (built if needed).

    ``images`` is uint8 [N, 3, 32, 32], ``labels`` int64 [N], the same as
    :func:`pdl_cinic10.data.load_split` returns for the PNGs. ``workers`` is the
    number of decoding processes when the cache is built (None: one per CPU, for
    large splits).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    folder = cache_dir_for(root, cache_dir)
    files = split_files(root, split)  # listed once: for the fingerprint and, if needed, the build
    fingerprint = _fingerprint(files)
    arrays = _read_valid(folder, split, fingerprint)
    if arrays is None:
        arrays = _build(files, fingerprint, split, folder, workers)
    images, labels = (torch.from_numpy(a) for a in arrays)
    return images.to(device), labels.to(device)


def build(
    root: str | os.PathLike, split: str, folder: str | os.PathLike, *, workers: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Decode ``root/<split>`` into ``folder`` (under its lock) and return the arrays.

    If another process finished a valid cache while this one waited for the
    lock, that cache is returned and nothing is decoded.
    """
    files = split_files(root, split)
    return _build(files, _fingerprint(files), split, Path(folder), workers)


def _build(files: list[tuple[int, Path]], fingerprint: str, split: str, folder: Path, workers: int | None):
    """:func:`build` of the split's ``files`` (from :func:`split_files`), whose fingerprint is given."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{split}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        arrays = _read_valid(folder, split, fingerprint, quiet=True)
        if arrays is not None:
            return arrays
        images, labels = _decode_parallel(files, workers)
        manifest = {
            "format": FORMAT,
            "split": split,
            "count": len(labels),
            "source": fingerprint,
            "images_sha256": _sha256(images),
            "labels_sha256": _sha256(labels),
        }
        _manifest_path(folder, split).unlink(missing_ok=True)  # no manifest: no cache, until complete
        write_atomic(folder / f"{split}.images.npy", lambda f: np.save(f, images))
        write_atomic(folder / f"{split}.labels.npy", lambda f: np.save(f, labels))
        write_atomic(_manifest_path(folder, split), lambda f: f.write(json.dumps(manifest).encode()))
        return images, labels


def verify(folder: str | os.PathLike, split: str) -> str | None:
    """Why the cache of ``split`` in ``folder`` cannot be used (one line), or None if it is sound.

    Checks the manifest, the arrays' shapes and dtypes, and both checksums; not
    whether the PNG folder changed since (:func:`load` checks that too).
    """
    return _check(Path(folder), split)[0]


# -- internals -------------------------------------------------------------------------


def _read_valid(folder: Path, split: str, fingerprint: str, *, quiet: bool = False):
    """The cached arrays if the cache is sound and made from ``fingerprint``, else None."""
    if not _manifest_path(folder, split).exists():
        return None
    problem, manifest, arrays = _check(folder, split)
    if problem is None and manifest["source"] != fingerprint:
        problem = f"{split} PNGs changed since the cache was built"
    if problem is not None:
        if not quiet:
            warnings.warn(f"CINIC-10 cache {folder}: {problem}; rebuilding it", CacheWarning, stacklevel=3)
        return None
    return arrays


def _check(folder: Path, split: str):
    """``(problem or None, manifest, (images, labels))`` for the cache of ``split``."""
    try:
        manifest = json.loads(_manifest_path(folder, split).read_text())
        if manifest.get("format") != FORMAT:
            return f"format {manifest.get('format')} is not {FORMAT}", manifest, None
        images = np.load(folder / f"{split}.images.npy")
        labels = np.load(folder / f"{split}.labels.npy")
    except (OSError, ValueError, EOFError) as e:  # missing, truncated, not JSON / not .npy
        return f"unreadable ({type(e).__name__}: {e})", None, None
    n = manifest["count"]
    if images.shape != (n, 3, IMAGE_SIZE, IMAGE_SIZE) or images.dtype != np.uint8:
        return f"images are {images.dtype}{list(images.shape)}, expected uint8[{n}, 3, 32, 32]", manifest, None
    if labels.shape != (n,) or labels.dtype != np.int64:
        return f"labels are {labels.dtype}{list(labels.shape)}, expected int64[{n}]", manifest, None
    if _sha256(images) != manifest["images_sha256"]:
        return "images checksum mismatch", manifest, None
    if _sha256(labels) != manifest["labels_sha256"]:
        return "labels checksum mismatch", manifest, None
    return None, manifest, (images, labels)


def _fingerprint(files: list[tuple[int, Path]]) -> str:
    """SHA-256 over the PNGs' labels, names, sizes and modification times (no pixel reads)."""
    digest = hashlib.sha256()
    for label, path in files:
        stat = path.stat()
        digest.update(f"{label}/{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _decode_parallel(files: list[tuple[int, Path]], workers: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Decode ``files`` (``(label, path)`` pairs) in ``workers`` processes, in order.

    None: one process per CPU, but no more than one per 10,000 images (starting
    a process costs about a second; a small split decodes faster in this one).
    """
    paths = [path for _, path in files]
    labels = np.array([label for label, _ in files], dtype=np.int64)
    if workers is None:
        workers = min(os.cpu_count() or 1, len(paths) // 10_000)
    workers = max(1, min(workers, len(paths)))
    if workers == 1:
        return decode_files(paths), labels
    chunks = [paths[i::workers * 4] for i in range(workers * 4)]  # strided: even work per chunk
    images = np.empty((len(paths), 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    # spawn, not fork: the caller may be an engine with threads (a fork could inherit held locks)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, part in enumerate(pool.map(decode_files, chunks)):
            images[i :: workers * 4] = part
    return images, labels


def _sha256(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array)).cast("B")).hexdigest()


def _manifest_path(folder: Path, split: str) -> Path:
    return folder / f"{split}.json"


