"""The lab's reverse proxy in front of a hub: Debian's nginx, running the recipe of
docs/admin.md ("Opening the hub to the lab") as written there, with only its names,
paths, listening address and the hub's port put in for a test."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import shutil
import socket
import subprocess
from pathlib import Path

from hub_harness import open_path_to
from sim_host import pids_naming, terminate
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
#: In each test nginx's command line: how a killed run's is found.
MARK = "pdl-front-nginx"


def recipe() -> str:
    """The ``nginx`` block of docs/admin.md's section "Opening the hub to the lab"."""
    text = (REPO / "docs" / "admin.md").read_text()
    section = text.split("\n## Opening the hub to the lab\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```nginx\n(.*?)```", section, re.S).group(1)


def _put_in(conf: str, was: str, now: str) -> str:
    assert was in conf, f"docs/admin.md's nginx recipe no longer has {was!r}"
    return conf.replace(was, now)


@contextlib.contextmanager
def nginx_in_front(folder: Path, address: str, host: str, cert: Path, key: Path, hub_port: int):
    """nginx on ``address`` (ports 443 and 80) for ``host`` and ``*.host``, with ``cert``
    and ``key``, in front of the hub's proxy at ``127.0.0.1:hub_port``; stopped after."""
    folder = Path(folder) / MARK
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    shutil.chown(folder / "tmp", "www-data", "www-data")
    open_path_to(folder / "tmp")  # nginx's workers (www-data) keep bodies there
    conf = recipe()
    for was, now in (("hub.lab.example", host), ("/etc/pdl/tls/hub.crt", str(cert)),
                     ("/etc/pdl/tls/hub.key", str(key)), ("http://127.0.0.1:8000", f"http://127.0.0.1:{hub_port}"),
                     ("listen 80;", f"listen {address}:80;"), ("listen 443 ", f"listen {address}:443 ")):
        conf = _put_in(conf, was, now)
    (folder / "pdl-hub.conf").write_text(conf)
    temp = "".join(f"    {kind}_temp_path {folder}/tmp/{kind};\n"
                   for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    main = folder / "nginx.conf"
    main.write_text(f"user www-data;\nworker_processes 1;\npid {folder}/nginx.pid;\nerror_log {folder}/error.log;\n"
                    f"events {{}}\nhttp {{\n    access_log {folder}/access.log;\n{temp}"
                    f"    include {folder}/pdl-hub.conf;\n}}\n")
    terminate(pids_naming(MARK, ("nginx",)))  # what a killed run left
    check = subprocess.run([NGINX, "-t", "-p", str(folder), "-c", str(main)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # a session of its own: its workers go with it (a worker left behind keeps ports 443 and 80)
    with open(folder / "stderr.log", "wb") as stderr:  # the child keeps its own copy
        proc = subprocess.Popen([NGINX, "-p", str(folder), "-c", str(main), "-g", "daemon off;"],
                                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}: {(folder / 'error.log').read_text()[-2000:]}")
        try:
            socket.create_connection((address, 443), 1).close()
            return True
        except OSError:
            return False

    try:
        wait_until(listening, 30, what="nginx on port 443")
        yield folder
    finally:
        proc.terminate()  # a fast shutdown: open WebSockets are cut
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        terminate(pids_naming(MARK, ("nginx",)))
