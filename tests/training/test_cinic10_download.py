"""pdl_cinic10.download against a real HTTP server on 127.0.0.1 (with Range support)."""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdl_cinic10 import CLASSES, SPLITS
from pdl_cinic10.data import load_split
from pdl_cinic10.download import DownloadError, download, extract, main
from pdl_cinic10.sample import make_sample

REPO = Path(__file__).resolve().parents[2]
NAME = "CINIC-10.tar.gz"


def build_archive(tmp: Path, *, wrapper: str | None = None) -> bytes:
    """A .tar.gz with the CINIC layout (2 train, 1 valid, 1 test image per class)."""
    source = make_sample(tmp / "source", train_per_class=2, test_per_class=1, valid_per_class=1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for split in SPLITS:
            tar.add(source / split, arcname=f"{wrapper}/{split}" if wrapper else split)
    return buffer.getvalue()


class ArchiveServer:
    """Serves ``body`` at /CINIC-10.tar.gz on 127.0.0.1 and records each request.

    honour_range: answer ``Range: bytes=N-`` with 206 (else ignore it, send 200).
    truncate_next: the next answer announces the full Content-Length but sends
    only half of it, then closes the connection.
    """

    def __init__(self, body: bytes, *, honour_range: bool = True, truncate_next: bool = False):
        self.body = body
        self.honour_range = honour_range
        self.truncate_next = truncate_next
        self.ranges: list[str | None] = []  # Range header of each request
        self.sent = 0  # body bytes handed to the socket, all requests together (counted before the write)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/{NAME}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                requested = self.headers.get("Range")
                server.ranges.append(requested)
                if self.path != f"/{NAME}":
                    self.send_error(404)
                    return
                size, start = len(server.body), 0
                if requested and server.honour_range:
                    start = int(re.fullmatch(r"bytes=(\d+)-", requested)[1])
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                else:
                    self.send_response(200)
                payload = server.body[start:]
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if server.truncate_next:
                    server.truncate_next = False
                    payload = payload[: len(payload) // 2]
                server.sent += len(payload)  # before the write: the client may return as soon as it has the bytes
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def archive(tmp_path) -> bytes:
    return build_archive(tmp_path)


@pytest.fixture
def serve():
    servers = []

    def start(body: bytes, **options) -> ArchiveServer:
        servers.append(ArchiveServer(body, **options))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.mark.integration
def test_download_and_extract_give_the_cinic_layout(tmp_path, archive, serve):
    server = serve(archive)
    target = tmp_path / "data" / NAME

    path = download(server.url, target, md5=md5_of(archive), chunk_bytes=4096, progress=False)

    assert path == target and target.read_bytes() == archive
    assert not target.with_name(NAME + ".part").exists()
    assert extract(target, tmp_path / "data") == tmp_path / "data"
    images, labels = load_split(tmp_path / "data", "train")
    assert images.shape == (20, 3, 32, 32) and labels.tolist() == [c for c in range(10) for _ in range(2)]


@pytest.mark.integration
def test_existing_verified_file_is_returned_without_network(tmp_path, archive, serve):
    server = serve(archive)
    target = tmp_path / NAME
    target.write_bytes(archive)

    assert download(server.url, target, md5=md5_of(archive), progress=False) == target
    assert server.ranges == []


@pytest.mark.integration
def test_resume_requests_only_the_missing_bytes(tmp_path, archive, serve):
    server = serve(archive)
    target = tmp_path / NAME
    half = len(archive) // 2
    target.with_name(NAME + ".part").write_bytes(archive[:half])

    download(server.url, target, md5=md5_of(archive), chunk_bytes=4096, progress=False)

    assert server.ranges == [f"bytes={half}-"]
    assert server.sent == len(archive) - half
    assert target.read_bytes() == archive


@pytest.mark.integration
def test_server_ignoring_range_makes_download_start_over(tmp_path, archive, serve):
    server = serve(archive, honour_range=False)
    target = tmp_path / NAME
    target.with_name(NAME + ".part").write_bytes(b"x" * 1000)  # appending would corrupt

    download(server.url, target, md5=md5_of(archive), chunk_bytes=4096, progress=False)

    assert server.ranges == ["bytes=1000-"] and target.read_bytes() == archive


@pytest.mark.integration
def test_md5_mismatch_names_both_and_leaves_no_file(tmp_path, archive, serve):
    server = serve(archive)
    target = tmp_path / "data" / NAME
    wrong = "0" * 32

    with pytest.raises(DownloadError, match=f"expected {wrong}, got {md5_of(archive)}"):
        download(server.url, target, md5=wrong, progress=False)

    assert list(target.parent.iterdir()) == []


@pytest.mark.integration
def test_truncated_transfer_raises_and_rerun_resumes(tmp_path, archive, serve):
    server = serve(archive, truncate_next=True)
    target = tmp_path / NAME
    half = len(archive) // 2

    with pytest.raises(DownloadError, match=rf"truncated: got {half} of {len(archive)} bytes.*resume"):
        download(server.url, target, md5=md5_of(archive), chunk_bytes=4096, progress=False)
    assert not target.exists()
    assert target.with_name(NAME + ".part").read_bytes() == archive[:half]

    download(server.url, target, md5=md5_of(archive), chunk_bytes=4096, progress=False)
    assert server.ranges == [None, f"bytes={half}-"]
    assert target.read_bytes() == archive


@pytest.mark.integration
@pytest.mark.parametrize("wrapper", [None, "CINIC-10"])
def test_extract_accepts_top_level_splits_or_one_wrapper_folder(tmp_path, wrapper):
    archive = tmp_path / NAME
    archive.write_bytes(build_archive(tmp_path, wrapper=wrapper))

    extract(archive, tmp_path / "out")

    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(SPLITS)
    assert sorted(p.name for p in (tmp_path / "out" / "test").iterdir()) == sorted(CLASSES)


@pytest.mark.unit
def test_extract_refuses_members_outside_the_destination(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))

    with pytest.raises(tarfile.TarError):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


@pytest.mark.unit
def test_extract_rejects_an_archive_without_splits(tmp_path):
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        sample = make_sample(tmp_path / "s", train_per_class=1, test_per_class=1, valid_per_class=1)
        tar.add(sample / "train", arcname="train")

    with pytest.raises(ValueError, match=r"no train/, valid/ and test/ folders"):
        extract(archive, tmp_path / "out")


@pytest.mark.integration
def test_cli_downloads_unpacks_and_removes_the_archive(tmp_path, archive, serve, capsys):
    server = serve(archive)
    dest = tmp_path / "cinic"

    assert main([str(dest), "--url", server.url, "--md5", md5_of(archive), "--no-progress"]) == 0

    assert sorted(p.name for p in dest.iterdir()) == sorted(SPLITS)
    assert str(dest) in capsys.readouterr().out
    assert main([str(dest), "--url", server.url, "--no-progress"]) == 0  # already there: no fetch
    assert len(server.ranges) == 1


@pytest.mark.integration
@pytest.mark.parametrize("problem", ["missing", "md5"])
def test_cli_error_is_one_line_and_exit_status_2(tmp_path, archive, serve, problem):
    server = serve(archive)
    url = server.url.replace(NAME, "missing.tar.gz") if problem == "missing" else server.url
    result = subprocess.run(
        [sys.executable, "-m", "pdl_cinic10.download", str(tmp_path / "cinic"), "--url", url,
         "--md5", "f" * 32, "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )

    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pdl-cinic10-download: error: ")
    assert ("HTTP 404" if problem == "missing" else "md5 mismatch") in lines[0]


@pytest.mark.integration
def test_complete_part_file_is_verified_and_kept(tmp_path, archive, serve):
    server = serve(archive)
    target = tmp_path / "data" / NAME
    target.parent.mkdir()
    target.with_name(NAME + ".part").write_bytes(archive)  # e.g. interrupted before the rename

    download(server.url, target, md5=md5_of(archive), progress=False)

    assert server.ranges == [f"bytes={len(archive)}-"] and server.sent == 0
    assert target.read_bytes() == archive
