"""A real JupyterHub (with configurable-http-proxy) for tests, on 127.0.0.1 only.

:class:`Hub` runs ``jupyterhub`` with the project's ``jupyterhub_config.py`` in a
temporary state directory, plus a test service token with admin scopes.
:class:`Kernel` talks to a kernel on a spawned server through the proxy, over the
real websocket protocol. Everything a test starts is stopped by PID, and stray
processes under the temporary directory are killed at the end.

Every ``hub`` fixture, local or on the simulated Swarm, goes through :func:`running`
(mostly by way of :func:`hub_fixture`); when a test that uses one fails,
tests/conftest.py adds the hub's log and its servers' logs to the report.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import requests
import websocket
from jupyterhub.utils import subdomain_hook_idna

from pdl.process import pid_alive
from pdl_spawner.accounts.credentials import SignupCodes
from pdl_spawner.settings.values import port_range
from pdl.contract import cluster_dir_in
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


#: The users' servers' ports of one test process's hubs: each pytest-xdist worker (gw0,
#: gw1, ...; the only process when the tests run one by one) has :data:`PORTS_A_WORKER`
#: of its own from 20000 on, so hubs of tests that run side by side never pick the same
#: port, and 29000 and up stay free for the tests that bind fixed ports there.
FIRST_SERVER_PORT, PORTS_A_WORKER, MAX_WORKERS = 20000, 1000, 9
#: The hubs' own ports (the proxy's, its API's, the hub's, a service's): each worker has
#: :data:`PORTS_A_WORKER` of its own from 11000 on, below the servers' and outside the
#: kernel's ephemeral range (32768-60999). A port the kernel picked free there could be
#: taken before the hub bound it, by a test beside it or by any outgoing connection (a
#: proxy's API port was: EADDRINUSE, the hub did not start).
FIRST_HUB_PORT = 11000
_hub_port_turns = itertools.count()


def worker_index(worker: str | None = None) -> int:
    """The index of ``worker`` (default: this process's, ``$PYTEST_XDIST_WORKER``; gw0
    when the tests run in one process). ValueError past :data:`MAX_WORKERS` workers."""
    worker = worker if worker is not None else os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw"))
    if not 0 <= index < MAX_WORKERS:
        raise ValueError(f"the tests run in at most {MAX_WORKERS} workers (gw0..gw{MAX_WORKERS - 1}), got {worker}")
    return index


def free_port() -> int:
    """A port of this process's own block (:data:`FIRST_HUB_PORT`) that no socket uses now,
    taken in turn so that a port just handed out is not handed out again soon."""
    low = FIRST_HUB_PORT + worker_index() * PORTS_A_WORKER
    for _ in range(PORTS_A_WORKER):
        port = low + next(_hub_port_turns) % PORTS_A_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or still in TIME_WAIT
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + PORTS_A_WORKER - 1}")


def server_ports(worker: str | None = None) -> tuple[int, int]:
    """(low, high), inclusive: the servers' port range of the hubs that ``worker``'s tests
    start (default: this process's, ``$PYTEST_XDIST_WORKER``). ValueError past
    :data:`MAX_WORKERS` workers."""
    low = FIRST_SERVER_PORT + worker_index(worker) * PORTS_A_WORKER
    return low, low + PORTS_A_WORKER - 1


def runs_as_root() -> bool:
    """Whether the hub (started by these tests) runs as root: each user then has their own account."""
    return os.geteuid() == 0


def open_path_to(path: Path) -> None:
    """Let other accounts pass through every folder down to ``path`` (search, not list:
    mode o+x), so that users' homes under a test's temporary folder can be entered by
    their owners; files the harness writes stay private (it writes them 0600)."""
    for part in [*reversed(Path(path).parents), Path(path)]:
        if part.stat().st_mode & 0o001 == 0:
            part.chmod(part.stat().st_mode | 0o011)


def gpu_type_choices(hub: Hub, user: str) -> dict[str, str]:
    """The spawn form's GPU type choices as ``user`` sees them, fetched as a browser does:
    value -> label ("" : "Any type (3 of 3 free)"); {} where the form has no such field."""
    page = hub.login(user).get(f"{hub.url}/hub/spawn").text
    field = re.search(r'<select[^>]*name="gpu_type"[^>]*>(.*?)</select>', page, re.S)
    return dict(re.findall(r'<option value="([^"]*)">([^<]*)</option>', field.group(1))) if field else {}


def gpu_types_in_browser(hub: Hub, page, user: str) -> list[str]:
    """The GPU type choices of ``user``'s spawn form as a real browser shows them, after
    logging in as ``user`` on ``page`` (a Playwright page)."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.password(user))
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**", timeout=30_000)
    return page.locator("#pdl-gpu-type option").all_inner_texts()


def stand_in_gpus(folder: Path, count: int, answer: str, memory: str = "") -> str:
    """Stand-in GPUs in ``folder`` (character devices ``nvidia<i>`` with no driver behind
    them; root only: mknod) and a fake ``nvidia-smi`` that prints ``folder/readings``
    (first ``answer``; a test rewrites it to change what nvidia-smi says), or
    ``folder/memory`` (``memory``) when asked for memory. Returns the hub config lines
    that use them (:func:`stand_in_gpu_config`)."""
    for index in range(count):
        node = folder / f"nvidia{index}"
        os.mknod(node, 0o666 | 0o020000, os.makedev(240, index))
        node.chmod(0o666)
    (folder / "readings").write_text(answer)
    (folder / "memory").write_text(memory)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncase \"$1\" in\n  *memory*) cat {folder / 'memory'} ;;\n"
                   f"  *) cat {folder / 'readings'} ;;\nesac\n")
    smi.chmod(0o755)
    open_path_to(folder)
    return stand_in_gpu_config(folder)


def stand_in_gpu_config(folder: Path) -> str:
    """The hub config lines that give the embedded default the stand-in GPUs of
    :func:`stand_in_gpus` (``c.PDLLocalSpawner.gpu_device_template`` and ``nvidia_smi``)."""
    return (f"c.PDLLocalSpawner.gpu_device_template = {str(folder / 'nvidia{index}')!r}\n"
            f"c.PDLLocalSpawner.nvidia_smi = {str(folder / 'nvidia-smi')!r}\n")


#: The tests' hubs' public host name: each user's server is then ``<name>.hub.localhost``,
#: which resolves as every ``*.localhost`` does (host_names). A dotted name, because
#: Python's cookie jar files the dotless ``localhost`` as ``localhost.local`` and never
#: sends back the session id JupyterHub sets for ``.localhost`` (browsers do): the hub
#: then refuses the forms' XSRF tokens, which are bound to it. ``localhost`` itself, the
#: embedded default, is what tests/hub/test_hub_origins.py runs, in a real browser.
PUBLIC_HOST = "hub.localhost"


class Hub:
    """A JupyterHub process for one test module.

    As root (CI), users' servers run as their own Unix accounts, ``<prefix><name>`` with
    a prefix unique to this hub, and homes in ``root/homes``; :meth:`close` deletes them.
    """

    #: Listed users the harness does not sign up (a test does); a subclass's hub may not set it.
    signs_up_later: tuple[str, ...] = ()

    def __init__(self, root: Path, users: list[str], pool: list[str], spawner_env: dict | None = None,
                 hub_env: dict | None = None, extra_config: str = "", signs_up_later: tuple[str, ...] = (),
                 public_host: str = PUBLIC_HOST, public_url: str | None = None, port: int | None = None):
        self.root = Path(root)
        self.users = users
        self.signs_up_later = signs_up_later  # listed users the harness does not sign up (a test does)
        self.pool = pool
        self.token = secrets.token_hex(16)
        if public_url:  # a lab's name, e.g. https://hub.lab.test; the hub on its port unless told (a proxy in front)
            self.url = public_url.rstrip("/")
            self.port = port or urlsplit(public_url).port or {"https": 443, "http": 80}[urlsplit(public_url).scheme]
        else:
            self.port = free_port()
            self.url = f"http://{public_host}:{self.port}"  # the hub's public URL (PDL_PUBLIC_URL)
        # fixed for the hub's lifetime: running servers keep talking to these after a restart
        self.internal_port, self.proxy_api_port = free_port(), free_port()
        self.admin_view_port = free_port()  # the pdl-admin service (pdl_spawner/admin/view.py)
        self.hub_env = hub_env or {}  # extra environment of the hub process (PDL_* settings)
        # its users' servers' ports (PDL_PORT_RANGE): this worker's, unless the test sets them
        self.port_range = (port_range(self.hub_env["PDL_PORT_RANGE"]) if "PDL_PORT_RANGE" in self.hub_env
                           else server_ports())
        self.state_dir = self.root / "state"
        self.log_path = self.root / "hub.log"
        self.spawner_env = {**openmp_wait_env(), **(spawner_env or {})}
        self.proc: subprocess.Popen | None = None
        self.account_prefix = f"t{secrets.token_hex(2)}-"  # this hub's users' Unix accounts
        self.homes_root = self.root / "homes"
        self.extra_config = extra_config  # lines appended to the config (a fault injected at its seam)
        self.passwords: dict[str, str] = {}  # each listed user's own, as they signed up (not the admin's)

    # -- lifecycle -----------------------------------------------------------

    def _write_config(self) -> Path:
        config = self.root / "test_config.py"
        config.touch(mode=0o600)  # holds an admin token: the users' accounts must not read it
        config.write_text(
            f"""
load_subconfig({str(REPO / 'jupyterhub_config.py')!r})
c.JupyterHub.services.append({{"name": "pdl-tests", "api_token": {self.token!r}}})
c.JupyterHub.load_roles.append({{
    "name": "pdl-tests",
    "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "list:users", "read:users",
               "read:metrics"],
    "services": ["pdl-tests"],
}})
c.HostServer.home_dir_template = {str(self.root / 'home' / '{username}')!r}
c.HostServer.account_prefix = {self.account_prefix!r}
c.HostServer.homes_root = {str(self.homes_root)!r}
c.PDLLocalSpawner.default_workers = 1
c.Spawner.environment = {json.dumps(self.spawner_env)}
c.JupyterHub.log_level = "INFO"
{self.extra_config}
"""
        )
        return config

    def start(self) -> Hub:
        if len(self.users) > 1 and not runs_as_root() and not os.environ.get("CI"):
            import pytest

            pytest.skip("a hub with several users needs root (each gets a Unix account); it refuses to start")
        if runs_as_root():
            self.homes_root.mkdir(parents=True, exist_ok=True)
            open_path_to(self.homes_root)
        config = self._write_config()
        # the hub refuses PDL_* variables that are not its settings: the test run's own
        # (PDL_SKIP_IMAGE_BUILD, PDL_CPU_PROFILE, ...) stay out of its environment
        env = dict(
            {name: value for name, value in os.environ.items() if not name.startswith("PDL_")},
            PDL_STATE_DIR=str(self.state_dir),
            PDL_USERS=",".join(self.users),
            PDL_HUB_PORT=str(self.port),
            PDL_HUB_INTERNAL_PORT=str(self.internal_port),
            PDL_PROXY_API_PORT=str(self.proxy_api_port),
            PDL_ADMIN_VIEW_PORT=str(self.admin_view_port),
            PDL_PORT_RANGE="{}-{}".format(*self.port_range),
            PDL_PUBLIC_URL=self.url,
            PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **self.hub_env,
        )
        if env.get("PDL_SPAWNER", "local") == "local":  # the embedded default's slots
            env["PDL_POOL"] = ",".join(self.pool)
        log = open(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_until(self._up, 60, what="the hub to answer")
        self.sign_up_listed_users()
        return self

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not answering yet: still starting
            return False

    def stop_hub(self, sig=signal.SIGTERM) -> None:
        """Stop the hub process only (user servers keep running: cleanup_servers is off)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        # the proxy is the hub's child; with SIGKILL it may be left behind
        for pid in pids_matching(lambda cmd, cwd: "configurable-http-proxy" in cmd and str(self.port) in cmd
                                 and cwd.startswith(str(self.root))):
            _kill(pid)

    def close(self) -> None:
        """Stop every user's server (the listed users', and any other's that runs: a
        member of an allowed group who logged in), the hub, and anything left under the
        temp dir."""
        try:
            if self.proc and self.proc.poll() is None:
                for user in dict.fromkeys([*self.users, *self.running_servers()]):
                    self.api("DELETE", f"/users/{user}/server", timeout=30)
                wait_until(lambda: not self.running_servers(), 60, what="servers to stop")
        except Exception:
            pass
        self.stop_hub()
        for pid in pids_matching(lambda cmd, cwd: str(self.root) in cmd or cwd.startswith(str(self.root))):
            _kill(pid)
        for user in self.users:
            self.delete_account(user)

    def account(self, user: str) -> str:
        """The Unix account ``user``'s server runs as (the hub's own user without root)."""
        return f"{self.account_prefix}{user}" if runs_as_root() else pwd.getpwuid(os.geteuid()).pw_name

    def delete_account(self, user: str) -> None:
        """Delete ``user``'s Unix account and home, once no process of theirs is left."""
        if not runs_as_root():
            return
        name = self.account(user)
        if not remove_account(name):
            return
        from pdl_spawner.host import device_cgroup

        if device_cgroup.support():  # its cgroup, left behind when the hub was killed
            device_cgroup.DeviceCgroup(name).remove()

    def log_tail(self, n: int = 80) -> str:
        """The last ``n`` lines of the hub's log but the tests' own polls
        (:attr:`OWN_POLLS`); the log also holds what users' servers print (a local
        spawner's servers write to the hub's stdout and stderr)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join([line for line in lines if not self.OWN_POLLS.search(line)][-n:])

    def wait_for_log(self, text: str, timeout: float, n: int = 2000) -> None:
        """Wait (up to ``timeout`` s) for ``text`` in the last ``n`` lines of the hub's log:
        the hub logs what it did once it is done, after the change a test sees elsewhere
        (a reclaim frees the GPUs, then says so)."""
        wait_until(lambda: text in self.log_tail(n), timeout, what=lambda: f"{text!r} in the hub's log")

    #: Lines an admin should not find in the hub's log (issue 31): a line per look at a
    #: server's engine lease (debug lines), a warning about the options PDL applies itself.
    LOG_NOISE = re.compile(r".*(GET \S*/pdl/api/lease|unhandled user_options).*")

    def log_noise(self) -> list[str]:
        """The lines of the hub's log (servers' output included) that match :attr:`LOG_NOISE`."""
        return [m[0] for m in self.LOG_NOISE.finditer(self.log_path.read_text(errors="replace"))]

    def server_logs(self, tail: int = 40) -> dict[str, str]:
        """The last ``tail`` lines of each log the users' servers keep apart from the hub's:
        their controller's and engines' (ipyparallel's, in the cluster folder's profile),
        by file."""
        logs = {}
        for user in self.users:
            folder = Path(cluster_dir_in(self.home(user))) / "profile" / "log"
            for path in sorted(folder.glob("*.log")) if folder.is_dir() else []:
                try:
                    logs[str(path)] = "\n".join(path.read_text(errors="replace").splitlines()[-tail:])
                except OSError:
                    continue
        return logs

    #: The tests' own successful polls of the hub's API (every 0.2 s while a test waits): a
    #: failing test's report leaves them out, or its last 200 lines would be nothing else.
    OWN_POLLS = re.compile(r"\] 200 GET /hub/api/\S* \(pdl-tests@")

    def failure_sections(self) -> list[tuple[str, str]]:
        """What a failing test's report shows of this hub (tests/conftest.py): the last 200
        lines of the hub's log but the tests' own polls (:attr:`OWN_POLLS`), then each
        server log, as (title, text)."""
        sections = [(f"hub log ({self.log_path}; the tests' own polls left out)", self.log_tail(200))]
        sections += [(f"server log ({path})", text) for path, text in self.server_logs().items()]
        return sections

    def check_nothing_left(self) -> None:
        """After :meth:`close`: fail if an engine outlived the hub."""
        assert not engine_processes(self.root), "engines left running after the hub was closed"

    # -- REST ------------------------------------------------------------------

    def api(self, method: str, path: str, token: str | None = None, **kwargs) -> requests.Response:
        """A hub REST call, with the tests' admin service token unless ``token`` is given."""
        headers = {"Authorization": f"token {token or self.token}"}
        kwargs.setdefault("timeout", 60)
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, **kwargs)

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of the series ``name`` with exactly ``labels`` on the hub's
        ``/hub/metrics`` (read with the tests' token, which has ``read:metrics``); None
        when the hub has no such series."""
        from prometheus_client.parser import text_string_to_metric_families

        r = requests.get(f"{self.url}/hub/metrics", headers={"Authorization": f"token {self.token}"}, timeout=60)
        r.raise_for_status()
        return next((sample.value for family in text_string_to_metric_families(r.text) for sample in family.samples
                     if sample.name == name and sample.labels == labels), None)

    def user_url(self, user: str) -> str:
        """``user``'s server as a browser reaches it: its own origin, ``<name>.<hub's host>``
        (JupyterHub's subdomain_host), then ``/user/<name>``; no trailing slash."""
        return f"{self._origin_of(user, 'user')}/user/{user}"

    def service_url(self, name: str) -> str:
        """The hub service ``name`` as a browser reaches it (its own origin too)."""
        return f"{self._origin_of(name, 'service')}/services/{name}"

    def _origin_of(self, name: str, kind: str) -> str:
        public = urlsplit(self.url)
        return f"{public.scheme}://{subdomain_hook_idna(name, public.hostname, kind)}" + (
            f":{public.port}" if public.port else "")

    def server_api(self, user: str, path: str, token: str | None = None, method: str = "GET") -> dict:
        """GET (or ``method``) ``/user/<user><path>`` from the user's own server (with a token of theirs)."""
        r = requests.request(method, f"{self.user_url(user)}{path}", timeout=30,
                             headers={"Authorization": f"token {token or self.user_token(user)}"})
        r.raise_for_status()
        return r.json()

    def spawn(self, user: str, workers: int | None) -> requests.Response:
        body = {} if workers is None else {"workers": workers}
        return self.api("POST", f"/users/{user}/server", json=body)

    def user_model(self, user: str) -> dict:
        r = self.api("GET", f"/users/{user}")
        r.raise_for_status()
        return r.json()

    def server_ready(self, user: str) -> bool:
        server = self.user_model(user).get("servers", {}).get("")
        return bool(server and server.get("ready"))

    def wait_ready(self, user: str, timeout: float = 90) -> None:
        try:
            wait_until(lambda: self.server_ready(user), timeout, what=f"{user}'s server")
        except TimeoutError:
            raise TimeoutError(f"{user}'s server not ready:\n{self.log_tail()}") from None

    def wait_spawned(self, user: str, timeout: float = 120) -> tuple[bool, str]:
        """Follow the spawn's progress events: (True, "") once ready, (False, message) if it failed."""
        with self.api("GET", f"/users/{user}/server/progress", stream=True, timeout=timeout) as r:
            r.raise_for_status()
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                event = json.loads(line[len("data:"):])
                if event.get("ready"):
                    return True, ""
                if event.get("failed"):
                    return False, event.get("message", "")
        return self.server_ready(user), "the progress stream ended"

    def home(self, user: str) -> Path:
        """The user's home: their account's (as root), else ``PDLLocalSpawner.home_dir_template``'s."""
        return self.homes_root / self.account(user) if runs_as_root() else self.root / "home" / user

    def processes_of(self, user: str) -> dict[int, str]:
        """``user``'s processes (server, controller, engines, kernels, helpers) -> their role."""
        return user_processes(self.home(user))

    def lasting_processes_of(self, user: str) -> dict[int, str]:
        """``user``'s processes but helpers (:func:`lasting_processes`) -> their role."""
        return lasting_processes(self.home(user))

    def rss_kib(self) -> int:
        """The hub process's resident memory (VmRSS), in KiB."""
        return proc_status_kib(self.proc.pid, "VmRSS")

    def running_servers(self) -> list[str]:
        r = self.api("GET", "/users")
        return [u["name"] for u in r.json() if u.get("servers")]

    def user_token(self, user: str) -> str:
        r = self.api("POST", f"/users/{user}/tokens", json={"note": "tests"})
        r.raise_for_status()
        return r.json()["token"]

    def password(self, user: str) -> str:
        """``user``'s own password: the admin's as ``scripts/serve`` prints it (the state
        folder's ``password``), anyone else's as :meth:`sign_up_listed_users` chose it."""
        if user == self.users[0]:
            return (self.state_dir / "password").read_text().strip()
        return self.passwords[user]

    def signup_codes(self) -> dict[str, str]:
        """The listed users' one-time sign-up codes not used yet, as ``scripts/serve`` prints
        them (the state folder's ``signup-codes``)."""
        return SignupCodes(self.state_dir).ensure([])

    def sign_up_listed_users(self) -> None:
        """Every listed user but the admin signs up through the form, with the link of
        their one-time code and a random password of their own, and is approved at once;
        once (a restarted hub keeps them)."""
        codes = None
        for user in self.users[1:]:
            if user not in self.passwords and user not in self.signs_up_later:
                codes = codes if codes is not None else self.signup_codes()
                password = secrets.token_urlsafe(12)
                answer = self.signup(user, password, code=codes.get(user, ""))
                if "approved" not in answer:
                    raise RuntimeError(f"{user} could not sign up: {answer}\n{self.log_tail()}")
                self.passwords[user] = password

    def signup(self, user: str, password: str, confirmation: str | None = None, code: str = "") -> str:
        """Sign up through ``/hub/signup`` (``?code=`` with ``code``, as a sign-up link
        opens it), as a browser does; the page's one-line answer (a refusal's too)."""
        r = self.signup_response(user, password, confirmation, code)
        if r.status_code != 400:  # a field past its bound: the page says why
            r.raise_for_status()
        return page_alert(r.text)

    def signup_response(self, user: str, password: str, confirmation: str | None = None, code: str = "",
                        browser: requests.Session | None = None, **fields: str) -> requests.Response:
        """:meth:`signup`'s answer, whole (status and page), with ``fields`` added to the
        form; in ``browser`` (one that opened the sign-up page before) when given."""
        s = browser if browser is not None else requests.Session()
        page = f"{self.url}/hub/signup" + (f"?code={code}" if code else "")
        if browser is None:
            s.get(page, timeout=10).raise_for_status()
        form = {
            "_xsrf": s.cookies.get("_xsrf", ""),
            "username": user,
            "signup_password": password,
            "signup_password_confirmation": password if confirmation is None else confirmation,
            **fields,
        }
        return s.post(page, data=form, timeout=30)  # the form posts back to the page's own address

    def login(self, user: str, password: str | None = None) -> requests.Session:
        """Log in through the login form, as a browser does; returns the cookie session."""
        return self.try_login(user, password)[0]

    def try_login(self, user: str, password: str | None = None,
                  browser: requests.Session | None = None) -> tuple[requests.Session, str]:
        """:meth:`login`, and the login page's message when it refused ("" when it let in);
        in ``browser``'s cookies when given (a browser that logged in before), else a new one."""
        s = browser if browser is not None else requests.Session()
        s.get(f"{self.url}/hub/login", timeout=10).raise_for_status()
        form = {
            "_xsrf": s.cookies.get("_xsrf", ""),
            "username": user,
            "password": self.password(user) if password is None else password,
        }
        r = s.post(f"{self.url}/hub/login", data=form, timeout=30, allow_redirects=False)
        return s, "" if r.status_code == 302 else page_alert(r.text)

    def reservations(self) -> dict[str, str]:
        """slot -> owner, read from the ledger file."""
        from pdl_spawner.core.reservations import SlotLedger

        return {h.slot: h.owner for h in SlotLedger(self.state_dir / "reservations.sqlite").holdings()}


@contextlib.contextmanager
def running(hub: Hub, start: bool = True):
    """The lifecycle every ``hub`` fixture shares: ``hub`` started (unless ``start`` is
    false, for tests that start it themselves), then closed, failing if anything it made
    outlived it (:meth:`Hub.check_nothing_left`), also when it failed to start."""
    try:
        yield hub.start() if start else hub
    finally:
        hub.close()
        hub.check_nothing_left()


def openmp_wait_env() -> dict[str, str]:
    """``OMP_WAIT_POLICY`` as the test run has it, for users' servers and so their engines
    (empty where it is unset).

    scripts/test sets it to PASSIVE: tests run side by side on a machine's few cores,
    and OpenMP threads that spin while they wait (its default) take the cores the tests
    beside them need; a passive thread sleeps until it has work."""
    value = os.environ.get("OMP_WAIT_POLICY")
    return {"OMP_WAIT_POLICY": value} if value else {}


def hub_fixture(root: Path, users: list[str], pool: list[str], spawner_env: dict | None = None,
                hub_env: dict | None = None, extra_config: str = "", start: bool = True,
                signs_up_later: tuple[str, ...] = (), public_host: str = PUBLIC_HOST, public_url: str | None = None,
                port: int | None = None):
    """For a ``hub`` fixture (``yield from``): a :class:`Hub` :func:`running` in ``root``.
    The Swarm's is ``swarm_hub_harness.swarm_hub_fixture``; a fixture that prepares more
    before its tests (spawns servers) uses ``with running(Hub(...)) as hub:``."""
    with running(Hub(root, users, pool, spawner_env=spawner_env, hub_env=hub_env, extra_config=extra_config,
                     signs_up_later=signs_up_later, public_host=public_host, public_url=public_url, port=port),
                 start=start) as hub:
        yield hub


def admin_status(hub) -> dict:
    """The admin view's JSON (``/services/pdl-admin/api/status``), as the admin sees it."""
    r = requests.get(f"{hub.service_url('pdl-admin')}/api/status",
                     headers={"Authorization": f"token {hub.user_token('admin')}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def printed_usage(hub) -> list[dict[str, str]]:
    """The rows ``pdl-usage --since <yesterday, UTC> --csv`` prints for the hub's state
    folder, as the admin runs it (day, user, kind, worker, gpu_type, hours)."""
    import csv
    import datetime
    import io

    since = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)).date().isoformat()
    printed = subprocess.run([str(Path(sys.executable).parent / "pdl-usage"), "--since", since, "--csv",
                              "--state-dir", str(hub.state_dir)], capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    return list(csv.DictReader(io.StringIO(printed.stdout)))


def usage_seconds(rows: list[dict[str, str]], user: str, worker: str) -> float:
    """The seconds of ``user``'s ``worker`` (``gpu`` or ``cpu``) workers in :func:`printed_usage` rows."""
    return sum(float(r["hours"]) for r in rows if r["user"] == user and r["worker"] == worker) * 3600


#: How the flag on GPUs held idle and the release it leads to begin, in the panel.
GPU_IDLE_FLAG = "GPUs held idle: 0 % use since "
GPU_IDLE_RELEASED = "Engines released (GPUs held idle (0 % use) since "


def check_gpu_idle_flag(hub, user: str, kernel, cell: str, *, flag_s: float, timeout: float) -> None:
    """Wait (up to ``timeout`` s) for the hub's flag on ``user``'s GPUs held idle in their
    panel, with its release time; then the admin view lists it, idle for at least
    ``flag_s`` s (less a second), and ``cell`` (a ``%%distributed`` cell) prints it."""
    flag = wait_until(lambda: hub.server_api(user, "/pdl/api/cluster")["gpu_idle"], timeout,
                      what=lambda: f"the panel's flag on {user}'s GPUs; hub log: {hub.log_tail(30)}")
    assert flag.startswith(GPU_IDLE_FLAG) and " unless used." in flag, flag
    [row] = admin_status(hub)["gpu_idle"]
    assert row["owner"] == user and row["idle_s"] >= flag_s - 1, row
    out = kernel.execute_ok(cell, timeout=60)  # each cell says so too
    assert GPU_IDLE_FLAG in out["stderr"], out


def wait_gpu_idle_release(hub, user: str, timeout: float) -> None:
    """Wait (up to ``timeout`` s) for ``user``'s panel to say their engines were released
    for GPUs held idle."""
    wait_until(lambda: (hub.server_api(user, "/pdl/api/cluster")["message"] or "").startswith(GPU_IDLE_RELEASED),
               timeout, what=f"the panel to say: {GPU_IDLE_RELEASED}...")


def page_alert(page: str) -> str:
    """The text of a hub page's alert (the sign-up form's answer) or login error, on one line."""
    found = re.search(r'class="(?:alert [^"]*|login_error)"[^>]*>(.*?)</(?:div|p)>', page, re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found.group(1))).split()) if found else ""


def origin_answers(hub: Hub, user: str) -> dict[str, int]:
    """The HTTP status of ``user``'s server's ``/api/status``, with a token of theirs, at
    its own origin (``own``: 200 when it runs) and through the hub's origin (``hub``:
    JupyterHub answers there itself, never the user's server)."""
    headers = {"Authorization": f"token {hub.user_token(user)}"}
    return {where: requests.get(url, headers=headers, timeout=30, allow_redirects=False).status_code
            for where, url in (("own", f"{hub.user_url(user)}/api/status"),
                               ("hub", f"{hub.url}/user/{user}/api/status"))}


def squat_ports(kernel: Kernel, low: int, high: int) -> dict:
    """From ``kernel`` (a hostile user's), try to bind every port of ``low..high`` on
    127.0.0.1, with the open-file limit raised to the hard one, and keep what it got
    (:func:`release_ports` lets go). Returns ``{"squatted": the ports bound, "refused":
    EPERMs, "outside": the port that binding port 0 got, "own": the ports the hub gave the
    kernel's server (its own, then its controller's: the server contract)}``."""
    out = kernel.execute_ok(f"""
import errno, json, os, resource, socket, urllib.parse
from pdl.contract import ServerContract
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
squatted, refused = [], 0
for port in range({low}, {high} + 1):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port)); s.listen(); squatted.append(s)
    except OSError as e:
        s.close(); refused += e.errno == errno.EPERM
outside = socket.socket(); outside.bind(("127.0.0.1", 0)); outside_port = outside.getsockname()[1]; outside.close()
own = [urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"]).port, *ServerContract.from_env().controller_ports]
print(json.dumps({{"squatted": [s.getsockname()[1] for s in squatted], "refused": refused, "outside": outside_port,
                  "own": own}}))
""", timeout=120)
    return json.loads(out["stdout"].strip().splitlines()[-1])


def release_ports(kernel: Kernel) -> None:
    """Close what :func:`squat_ports` bound in ``kernel``."""
    kernel.execute_ok("for s in squatted: s.close()")


def queue_up(hub, user: str, workers: int = 1):
    """Ask for ``workers`` with ``queue: true``: the spawn waits (202) instead of failing."""
    r = hub.api("POST", f"/users/{user}/server", json={"workers": workers, "queue": True})
    assert r.status_code == 202, f"{r.status_code} {r.text}"  # pending: waiting in the queue, the request returns
    return r


class Progress(threading.Thread):
    """Follows a user's spawn progress stream: the messages, and how it ended."""

    def __init__(self, hub, user):
        super().__init__(daemon=True)
        self.hub, self.user = hub, user
        self.messages: list[str] = []
        self.ended: dict | None = None
        self.start()

    def run(self):
        with self.hub.api("GET", f"/users/{self.user}/server/progress", stream=True, timeout=300) as r:
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[len("data:"):])
                    self.messages.append(event.get("message", ""))
                    if event.get("ready") or event.get("failed"):
                        self.ended = event
                        return

    def saw(self, text: str) -> bool:
        return any(text in m for m in self.messages)


class Kernel:
    """A kernel on a user's server, driven over the Jupyter websocket protocol."""

    def __init__(self, hub: Hub, user: str, kernel_id: str | None = None):
        """A new kernel of ``user``'s, or (``kernel_id``) one that runs already, attached to again."""
        self.base = f"{hub.user_url(user)}/api"
        self.headers = {"Authorization": f"token {hub.user_token(user)}"}
        if kernel_id is None:
            r = requests.post(f"{self.base}/kernels", json={"name": "python3"}, headers=self.headers, timeout=60)
            r.raise_for_status()
            kernel_id = r.json()["id"]
        self.id = kernel_id
        self.session = uuid.uuid4().hex
        self.ws = None
        #: What the kernel printed while :meth:`execute` waited, for an earlier request
        #: (in a notebook, the output of a cell that ran before): e.g. a log line of its own.
        self.stray_output = ""
        self._connect()

    #: Seconds the websocket may go unread before :meth:`send` opens a new one: the server
    #: pings every 30 s and closes a connection whose pings go unanswered, and this
    #: client answers them only while it reads (a browser answers them all the time).
    UNREAD_S = 20.0

    #: Seconds one read of the websocket waits before :meth:`execute` looks at its own deadline.
    READ_POLL_S = 5.0
    #: Seconds the websocket's opening may take: the server answers it once the kernel has
    #: started and replied to a kernel_info request, which it waits for up to its
    #: ``kernel_info_timeout`` (jupyter_server's default, 60 s), as a browser waits for it.
    OPEN_S = 60.0

    def _connect(self) -> None:
        if self.ws is not None:
            self.ws.close()
        ws_url = re.sub(r"^http", "ws", f"{self.base}/kernels/{self.id}/channels")  # wss:// over https
        # over https, the CA the tests' requests trust (a lab's, made by the test)
        ca = {"ca_certs": os.environ["REQUESTS_CA_BUNDLE"]} if os.environ.get("REQUESTS_CA_BUNDLE") else None
        self.ws = websocket.create_connection(ws_url, header=[f"{k}: {v}" for k, v in self.headers.items()],
                                              timeout=self.OPEN_S, sslopt=ca)
        self.ws.settimeout(self.READ_POLL_S)
        self._read_at = time.monotonic()

    def send(self, code: str) -> str:
        """Ask the kernel to run ``code`` without waiting for it; returns the request's id
        (the ``msg_id`` its output messages name as their parent)."""
        if time.monotonic() - self._read_at > self.UNREAD_S:
            self._connect()
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": self.session,
                       "username": "tests", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        return msg_id

    def execute(self, code: str, timeout: float = 300, on_output=None) -> dict:
        """Run ``code``; returns {"stdout", "stderr", "display" (the text/plain of what it
        displayed), "error": {ename, evalue, traceback} | None, "seconds"}."""
        msg_id = self.send(code)
        out = {"stdout": "", "stderr": "", "display": "", "error": None}
        start = time.monotonic()
        while True:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"cell did not finish within {timeout} s; output so far: {out}")
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            finally:
                self._read_at = time.monotonic()
            if msg.get("parent_header", {}).get("msg_id") != msg_id or msg["channel"] != "iopub":
                if msg["channel"] == "iopub" and msg["msg_type"] == "stream":
                    self.stray_output += msg["content"]["text"]
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
                if on_output:
                    on_output(time.monotonic() - start, content["text"])
            elif kind == "error":
                out["error"] = content
            elif kind in ("display_data", "execute_result"):
                out["display"] += content.get("data", {}).get("text/plain", "") + "\n"
            elif kind == "status" and content["execution_state"] == "idle":
                out["seconds"] = time.monotonic() - start
                return out

    def execute_ok(self, code: str, **kwargs) -> dict:
        """:meth:`execute`, asserting that the cell raised nothing."""
        out = self.execute(code, **kwargs)
        assert out["error"] is None, out
        return out

    def interrupt(self) -> None:
        requests.post(f"{self.base}/kernels/{self.id}/interrupt", headers=self.headers, timeout=30).raise_for_status()

    def detach(self) -> None:
        """Close the websocket only: the kernel goes on (as when a browser tab closes)."""
        self.ws.close()

    def reattach(self) -> None:
        """Open a new websocket in place of this one, as a browser tab loaded again does.
        The server reads its first message once it has found the kernel answering and its
        output reaching the connection (jupyter_server's check, which it skips for a
        kernel it takes for busy)."""
        self._connect()

    def state(self) -> str:
        """The kernel's execution state as the server's kernels API tells it."""
        r = requests.get(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()["execution_state"]

    def close(self) -> None:
        try:
            self.ws.close()
            requests.delete(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=30)
        except Exception:
            pass


def pids_matching(predicate) -> list[int]:
    """PIDs whose command line / working directory satisfy ``predicate(cmd, cwd)``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if predicate(cmd, cwd):
            found.append(int(entry.name))
    return found


def listening_tcp(pids) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket that one of ``pids`` listens on (as root: any user's)."""
    import psutil

    found = []
    for pid in pids:
        for c in psutil.Process(pid).net_connections("inet"):
            if c.status == psutil.CONN_LISTEN:
                found.append((c.laddr.ip, c.laddr.port))
    return found


def remove_account(name: str) -> bool:
    """Delete the Unix account ``name`` and its home once no process of it is left, and
    first its runtime folder (the spawner's), while the uid is still its own: once the
    account is gone, an account another test makes beside this one may get the uid.
    False when there was no such account."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return False
    wait_until(lambda: not pids_of_uid(uid), 30, what=f"{name}'s processes to end")
    shutil.rmtree(f"/run/user/{uid}", ignore_errors=True)
    subprocess.run(["userdel", "--remove", name], capture_output=True)
    return True


def pids_of_uid(uid: int) -> list[int]:
    """Processes (zombies aside) whose real user id is ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            real_uid = int(proc_status(int(entry.name), "Uid").split()[0])
        except (OSError, KeyError, ValueError):
            continue
        if real_uid == uid and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def process_env(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def engine_processes(root: Path) -> dict[int, dict[str, str]]:
    """Engine processes started under ``root`` -> their PDL_*, CUDA_VISIBLE_DEVICES and HOME
    (not an engine's child between its fork and its exec: see :data:`SINGLE_PROCESS_ROLES`)."""
    result = {}
    for pid in pids_matching(lambda cmd, cwd: "pdl.runtime.boot engine" in cmd and cwd.startswith(str(root))):
        parent = _parent(pid)
        if parent is not None and _command_line(parent) == _command_line(pid):
            continue
        env = process_env(pid)
        if env is not None:
            result[pid] = {k: v for k, v in env.items()
                           if k.startswith("PDL_") or k in ("HOME", "CUDA_VISIBLE_DEVICES")}
    return result


#: Command-line marks of the processes of one user's server, and their role.
ROLES = (
    ("pdl_server.singleuser", "pdl-singleuser"),
    ("jupyterhub.singleuser", "server"),
    ("pdl.runtime.boot controller", "controller"),
    ("pdl.runtime.boot engine", "engine"),
    ("pdl.runtime.warm_parent", "warm parent"),
    ("ipykernel", "kernel"),
)


#: Roles whose process keeps no fork of itself: a child with the same command line is a
#: helper between its fork and its exec (the server's jupyter-lsp runs ``npm prefix -g``
#: in the background after the server is up; an engine starts its nanny), so it is
#: "other". A controller's schedulers are lasting forks of it, and stay "controller".
SINGLE_PROCESS_ROLES = frozenset({"pdl-singleuser", "server", "engine", "kernel", "warm parent"})


def _command_line(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def user_processes(home: Path) -> dict[int, str]:
    """Every process running with ``HOME=home`` (one user's server tree) -> its role
    (see :data:`ROLES`; ``"other"`` for anything else: a helper such as an engine's
    nanny, or a child between fork and exec, see :data:`SINGLE_PROCESS_ROLES`). Helpers
    come and go on their own: compare only the roles of :data:`ROLES` between snapshots."""
    result = {}
    for pid in pids_matching(lambda cmd, cwd: True):
        env = process_env(pid)
        cmd = _command_line(pid)
        if env is None or env.get("HOME") != str(home) or cmd is None:
            continue
        role = next((role for mark, role in ROLES if mark in cmd), "other")
        parent = _parent(pid)
        if role in SINGLE_PROCESS_ROLES and parent is not None and _command_line(parent) == cmd:
            role = "other"
        result[pid] = role
    return result


def lasting_processes(home: Path) -> dict[int, str]:
    """:func:`user_processes` without the helpers ("other"): the server, its controller,
    engines and kernels, which change only when something starts or stops them."""
    return {pid: role for pid, role in user_processes(home).items() if role != "other"}


def uid_of(pid: int) -> int | None:
    """The uid a process runs as; None once it has exited (a helper may, at any time)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None


def proc_status(pid: int, field: str) -> str:
    """A field of /proc/<pid>/status, e.g. ``Umask`` -> ``"0077"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    raise KeyError(f"no {field} in /proc/{pid}/status")


def proc_status_kib(pid: int, field: str) -> int:
    """A memory field of /proc/<pid>/status (``"123456 kB"``) in KiB."""
    return int(proc_status(pid, field).split()[0])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
