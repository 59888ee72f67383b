"""Download, verify and unpack the official CINIC-10 archive.

CLI: ``pdl-cinic10-download [DEST] [--url URL] [--md5 MD5] [--keep-archive] [--no-progress]``.
An interrupted download resumes from ``<archive>.part`` when run again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import requests
from tqdm import tqdm

from . import ARCHIVE_MD5, ARCHIVE_URL, SPLITS
from .layout import LAYOUT, default_root, has_layout

__all__ = ["DownloadError", "download", "extract", "file_md5", "main"]


class DownloadError(RuntimeError):
    """The archive could not be fetched, arrived truncated, or has the wrong md5."""


def download(
    url: str,
    dest_file: str | os.PathLike,
    *,
    md5: str,
    chunk_bytes: int = 1 << 20,
    progress: bool = True,
    timeout: float = 30,
) -> Path:
    """Fetch ``url`` to ``dest_file`` and check its ``md5`` (hex); return the path.

    Streams into ``dest_file.part``, resuming it with an HTTP Range request if it
    exists. A truncated transfer raises DownloadError and keeps the .part for
    the next run; a wrong md5 raises DownloadError and deletes it. If
    ``dest_file`` already has the right md5, returns without any network access.
    ``timeout`` is seconds to connect and between received bytes.
    """
    dest = Path(dest_file)
    md5 = md5.lower()
    if dest.is_file() and file_md5(dest) == md5:
        return dest
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _fetch(url, part, chunk_bytes=chunk_bytes, progress=progress, timeout=timeout)
    actual = file_md5(part)
    if actual != md5:
        part.unlink()
        raise DownloadError(f"md5 mismatch for {url}: expected {md5}, got {actual}; deleted the download")
    part.replace(dest)
    return dest


def _fetch(url: str, part: Path, *, chunk_bytes: int, progress: bool, timeout: float) -> None:
    """Append the rest of ``url`` to ``part`` (or rewrite it if the server ignores Range)."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity"}  # count the archive's own bytes
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = requests.get(url, headers=headers, stream=True, timeout=timeout)
    except requests.RequestException as error:
        raise DownloadError(f"cannot reach {url}: {_reason(error)}") from error
    with response:
        if response.status_code == 416 and offset:  # .part is already complete
            return
        if response.status_code not in (200, 206):
            raise DownloadError(f"{url} answered HTTP {response.status_code} {response.reason}")
        if response.status_code == 200:
            offset = 0  # the server sends the whole file: start over
        elif not response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
            raise DownloadError(
                f"{url} answered a Range request for bytes {offset}- with "
                f"{response.headers.get('Content-Range')!r}; delete {part} to start over"
            )
        response.raw.enforce_content_length = False  # a short body is reported below, bytes kept
        length = response.headers.get("Content-Length")
        expected = int(length) if length is not None else None
        received = 0
        with (
            open(part, "ab" if offset else "wb") as out,
            tqdm(
                total=None if expected is None else offset + expected,
                initial=offset,
                unit="B",
                unit_scale=True,
                desc=part.name.removesuffix(".part"),
                disable=not progress,
            ) as bar,
        ):
            try:
                for chunk in response.iter_content(chunk_bytes):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            except requests.RequestException:
                if expected is None:
                    raise DownloadError(
                        f"connection to {url} broke after {offset + received} bytes; "
                        "run again to resume"
                    ) from None
    if expected is not None and received < expected:
        raise DownloadError(
            f"download of {url} was truncated: got {offset + received} of {offset + expected} "
            "bytes; run again to resume"
        )


def _reason(error: requests.RequestException) -> str:
    """A short reason like "[Errno 111] Connection refused", else the error's type."""
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", str(error))
    return found.group(0) if found else type(error).__name__


def file_md5(path: str | os.PathLike, *, chunk_bytes: int = 1 << 20) -> str:
    """Hex md5 of a file's content."""
    digest = hashlib.md5()
    with open(path, "rb") as file:
        while chunk := file.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def extract(archive: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Unpack ``archive`` so that ``dest_dir/{train,valid,test}/<class>/*.png`` exist.

    The splits may be at the archive's top level (as in the official one) or in
    one wrapper folder. Members that would land outside ``dest_dir``, links
    pointing out of it and device files are refused (tarfile's "data" filter).
    """
    dest = Path(dest_dir)
    existing = [split for split in SPLITS if (dest / split).exists()]
    if existing:
        raise FileExistsError(f"{dest / existing[0]} already exists; remove it or choose another destination")
    dest.mkdir(parents=True, exist_ok=True)
    unpacked = Path(tempfile.mkdtemp(prefix=".extracting-", dir=dest))
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(unpacked, filter="data")
            else:  # Python before 3.11.4 (Debian 12's 3.11.2): the same refusals, by hand
                tar.extractall(unpacked, members=_data_members(tar, unpacked))
        top = _splits_folder(unpacked)
        if top is None:
            raise ValueError(f"{archive} holds no train/, valid/ and test/ folders; expected {LAYOUT}")
        for split in SPLITS:
            (top / split).rename(dest / split)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    return dest


def _data_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """The members of ``tar``, refusing (tarfile.TarError) what tarfile's "data" filter refuses:
    a path or a link target outside ``dest``, an absolute link, a device or a fifo."""
    root = dest.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if member.name.startswith("/") or not target.is_relative_to(root):
            raise tarfile.TarError(f"{member.name!r} would be extracted outside {dest}")
        if member.isdev() or member.isfifo():
            raise tarfile.TarError(f"{member.name!r} is a device or a fifo")
        if member.issym() or member.islnk():
            base = target.parent if member.issym() else root
            if member.linkname.startswith("/") or not (base / member.linkname).resolve().is_relative_to(root):
                raise tarfile.TarError(f"{member.name!r} links outside {dest}: {member.linkname!r}")
        member.mode = (member.mode or 0o644) & 0o755  # no set-id or sticky bits, as the filter does
    return tar.getmembers()


def _splits_folder(unpacked: Path) -> Path | None:
    """``unpacked`` or its single sub-folder, whichever holds all the split folders."""
    entries = [entry for entry in unpacked.iterdir() if not entry.name.startswith(".")]
    candidates = [unpacked] + (entries if len(entries) == 1 else [])
    for folder in candidates:
        if all((folder / split).is_dir() for split in SPLITS):
            return folder
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``pdl-cinic10-download``; returns the exit status (2 on error)."""
    parser = argparse.ArgumentParser(
        prog="pdl-cinic10-download",
        description="Download and unpack CINIC-10 into DEST/{train,valid,test}/<class>/*.png.",
    )
    parser.add_argument(
        "dest", nargs="?", type=Path, metavar="DEST", help=f"target folder (default: {default_root()})"
    )
    parser.add_argument("--url", default=ARCHIVE_URL, help="archive URL (default: the official one)")
    parser.add_argument("--md5", default=ARCHIVE_MD5, help="expected md5 of the archive")
    parser.add_argument("--keep-archive", action="store_true", help="keep the .tar.gz after unpacking")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    dest = (args.dest or default_root()).expanduser()
    if has_layout(dest):
        print(f"CINIC-10 is already in {dest}")
        return 0
    archive = dest / (Path(args.url.split("?")[0]).name or "CINIC-10.tar.gz")
    try:
        download(args.url, archive, md5=args.md5, progress=not args.no_progress)
        extract(archive, dest)
        if not args.keep_archive:
            archive.unlink()
    except (DownloadError, OSError, ValueError, tarfile.TarError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"pdl-cinic10-download: error: {message}", file=sys.stderr)
        return 2
    print(f"CINIC-10 is ready in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
