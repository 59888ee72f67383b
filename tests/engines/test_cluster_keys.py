"""Two users' clusters on one machine: each has its own keys, one's client cannot reach
the other's controller, connection files are the user's alone, and what travels
between the notebook and the engines is encrypted (CurveZMQ)."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import ipyparallel as ipp
import pytest

from pdl_magics import DistributedSession

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_users(tmp_path_factory):
    """Two local sessions, each with its own IPYTHONDIR (as two users' homes would be)."""
    sessions = []
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PDL_CLUSTER_FILE", raising=False)
        mp.setenv("PDL_STATUS_DIR", str(tmp_path_factory.mktemp("status")))
        try:
            for name in ("a", "b"):
                mp.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp(f"ipython-{name}")))
                session = DistributedSession(local_slots=[f"cpu:{len(sessions)}"])
                session.run("pass", 1, out=io.StringIO(), err=io.StringIO())
                sessions.append(session)
            yield sessions
        finally:
            for session in sessions:
                session.close()


def client_file(session) -> Path:
    security = Path(session.engines.cluster.profile_dir) / "security"
    return security / f"ipcontroller-{session.engines.cluster.cluster_id}-client.json"


def test_each_cluster_has_its_own_keys_in_files_only_the_user_can_read(two_users):
    files = [client_file(s) for s in two_users]
    infos = [json.loads(f.read_text()) for f in files]
    for f, info in zip(files, infos):
        assert info["curve_serverkey"], f"{f} has no CurveZMQ key: traffic would be plain"
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, oct(f.stat().st_mode)
        assert stat.S_IMODE(f.parent.stat().st_mode) & 0o077 == 0, oct(f.parent.stat().st_mode)
    assert infos[0]["curve_serverkey"] != infos[1]["curve_serverkey"]


def test_one_users_client_gets_no_answer_from_the_others_controller(two_users):
    a, b = (json.loads(client_file(s).read_text()) for s in two_users)
    ports = {k: v for k, v in b.items() if isinstance(v, int) or k == "broadcast"}
    with socket.create_connection(("127.0.0.1", b["registration"]), 5):
        pass  # the port is open to anyone on the machine ...
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        ipp.Client({**a, **ports}, timeout=3)  # ... but A's keys do not open B's controller
    assert time.monotonic() - started < 30
    own = ipp.Client(b, timeout=10)  # B's own file does
    try:
        own.wait_for_engines(1, timeout=30)
        assert len(own.ids) == 1
    finally:
        own.close()


@pytest.mark.skipif(not hasattr(socket, "AF_PACKET") or os.geteuid() != 0, reason="needs root on Linux to sniff lo")
def test_cells_and_results_travel_encrypted(two_users):
    session = two_users[0]
    info = json.loads(client_file(session).read_text())
    ports = {v for v in info.values() if isinstance(v, int)}
    marker = "PDL-PLAINTEXT-MARKER-7f3a9c"
    seen = bytearray()
    packets = [0]
    stop = threading.Event()
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.2)

    def sniff():
        while not stop.is_set():
            try:
                frame = sniffer.recv(1 << 16)
            except TimeoutError:
                continue
            # Ethernet (14) + IPv4 (IHL) + TCP: keep frames to or from the controller's ports
            ihl = (frame[14] & 0x0F) * 4
            src, dst = (int.from_bytes(frame[14 + ihl + i:16 + ihl + i], "big") for i in (0, 2))
            if frame[23] == 6 and (src in ports or dst in ports):
                packets[0] += 1
                seen.extend(frame)

    thread = threading.Thread(target=sniff, daemon=True)
    thread.start()
    try:
        result = session.run(f"print({marker!r}); {marker!r} * 3", 1, out=io.StringIO(), err=io.StringIO())
    finally:
        time.sleep(0.5)
        stop.set()
        thread.join(5)
        sniffer.close()
    assert result.values == [repr(marker * 3)]
    assert packets[0] > 0, "the sniffer saw none of the cell's traffic"
    assert marker.encode() not in seen, "the cell's code or output crossed the wire in plain text"
