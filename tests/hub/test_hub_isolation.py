"""Users can't reach each other, or the host, through a real JupyterHub.

``ann`` and ``ben`` both run servers (1 and 2 workers). Tokens and login cookies of
one are refused on the other's server, Cluster panel and hub API; each user's engines
see only their own slots and run on their own share of the cores; spawn options
other than ``workers`` (an image, host mounts, ...) are refused before anything is
reserved; connection files and secrets are private from the start.

The pool names GPU slots so that the engines' ``CUDA_VISIBLE_DEVICES`` is checked,
but nothing here runs on a GPU: no cell runs on an engine.
"""

from __future__ import annotations

import os
import stat

import pytest
import requests

from hub_harness import Kernel, engine_processes, hub_fixture, proc_status
from waiting import wait_until

pytestmark = pytest.mark.hub

POOL = ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
USERS = ["admin", "ann", "ben", "cat"]
WORKERS = {"ann": 1, "ben": 2}
VALID = "the options are 'workers', a whole number from 1 to 4, and 'queue', true or false"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from hub_fixture(tmp_path_factory.mktemp("isolation-hub"), USERS, POOL)


def engines_of(hub, user: str) -> dict[int, dict[str, str]]:
    return {pid: e for pid, e in engine_processes(hub.root).items() if e.get("HOME") == str(hub.home(user))}


def start_server(hub, user: str, token: str | None = None) -> None:
    """Spawn ``user``'s server (as ``token``'s owner) and wait for all its engines,
    registered with its controller (each engine has started its nanny by then)."""
    r = hub.api("POST", f"/users/{user}/server", token=token, json={"workers": WORKERS[user]})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user)
    own = token or hub.user_token(user)
    wait_until(lambda: len(engines_of(hub, user)) == WORKERS[user]
               and len(hub.server_api(user, "/pdl/api/cluster", token=own)["engines"]) == WORKERS[user], 60,
               what=f"{user}'s engines")


@pytest.fixture(scope="module")
def both(hub):
    """ann and ben running, each with all their engines."""
    for user in WORKERS:
        start_server(hub, user)
    return hub


@pytest.fixture(scope="module")
def tokens(both):
    return {user: both.user_token(user) for user in WORKERS}


def server_calls(hub, owner: str) -> list[tuple[str, str]]:
    """Calls to ``owner``'s single-user server: Jupyter's API and the Cluster panel's."""
    base = hub.user_url(owner)
    return [
        ("GET", f"{base}/api/contents"),
        ("GET", f"{base}/api/kernels"),
        ("POST", f"{base}/api/kernels"),
        ("GET", f"{base}/pdl/api/cluster"),
        ("POST", f"{base}/pdl/api/stop"),
        ("POST", f"{base}/pdl/api/restart"),
    ]


def hub_calls(owner: str) -> list[tuple[str, str]]:
    return [
        ("GET", f"/users/{owner}"),
        ("POST", f"/users/{owner}/server"),
        ("DELETE", f"/users/{owner}/server"),
        ("POST", f"/users/{owner}/tokens"),
    ]


def as_user(token: str, method: str, url: str) -> requests.Response:
    return requests.request(method, url, headers={"Authorization": f"token {token}"}, timeout=60,
                            allow_redirects=False)


def answer_of(r: requests.Response) -> tuple[int, str]:
    """An answer's status and where it redirects to ("" for none)."""
    return r.status_code, r.headers.get("Location", "")


def refused(hub, answer: tuple[int, str]) -> bool:
    """Whether ``answer`` (:func:`answer_of`) opens nothing: 403 or 404, or the hub's
    redirect into ``/hub/`` that a stranger gets at a server (the hub then decides)."""
    status, location = answer
    return status in (403, 404) or (status == 302 and location.startswith(f"{hub.url}/hub/"))


def test_a_users_token_is_refused_on_another_users_server_and_api(both, tokens):
    hub = both
    ben_before = hub.lasting_processes_of("ben")
    ben_tokens = len(hub.api("GET", "/users/ben/tokens").json()["api_tokens"])

    # at ben's server ann's token counts for nothing: she gets a stranger's answer, the
    # hub's for a server that does not run (pdl_server/entry_gate.py), which opens nothing
    with_hers = {f"{m} {url}": answer_of(as_user(tokens["ann"], m, url)) for m, url in server_calls(hub, "ben")}
    strangers = {f"{m} {url}": answer_of(requests.request(m, url, timeout=60, allow_redirects=False))
                 for m, url in server_calls(hub, "ben")}
    assert with_hers == strangers, (with_hers, strangers)
    assert all(refused(hub, answer) for answer in with_hers.values()), with_hers
    answers = {f"{m} {p}": hub.api(m, p, token=tokens["ann"], json={}).status_code for m, p in hub_calls("ben")}
    assert {call: code for call, code in answers.items() if code not in (403, 404)} == {}, answers

    # nothing happened to ben: same processes (no kernel started, no engine restarted), no new token
    assert hub.lasting_processes_of("ben") == ben_before
    assert len(hub.api("GET", "/users/ben/tokens").json()["api_tokens"]) == ben_tokens
    assert hub.server_ready("ben")

    # ann's token does open ann's own server
    assert as_user(tokens["ann"], "GET", f"{hub.user_url('ann')}/api/contents").status_code == 200


def test_the_owners_token_gets_the_same_calls_through(both, tokens):
    hub = both
    token = tokens["ben"]
    for method, url in server_calls(hub, "ben"):
        if url.endswith("/restart"):  # would replace ben's engines: covered by tests/notebook/test_lab_panel.py
            continue
        r = as_user(token, method, url)
        assert r.status_code in (200, 201), f"{method} {url}: {r.status_code} {r.text[:200]}"
    assert hub.api("GET", "/users/ben", token=token).status_code == 200
    assert hub.api("POST", "/users/ben/tokens", token=token, json={"note": "own"}).status_code == 201
    # stop and start again with ben's own token
    assert hub.api("DELETE", "/users/ben/server", token=token).status_code in (202, 204)
    wait_until(lambda: "ben" not in hub.running_servers(), 60, what="ben's server to stop")
    assert "ben" not in hub.reservations().values()
    start_server(hub, "ben", token=token)


def test_a_users_login_cookie_cannot_open_another_users_server(both):
    hub = both
    ann = hub.login("ann")
    own = ann.get(f"{hub.user_url('ann')}/lab", timeout=60)  # through the OAuth redirects
    assert own.status_code == 200 and own.url.startswith(f"{hub.user_url('ann')}/lab")
    assert ann.get(f"{hub.user_url('ann')}/api/contents", timeout=60).status_code == 200

    other = ann.get(f"{hub.user_url('ben')}/lab", timeout=60)
    assert other.status_code in (403, 404), (other.status_code, other.url)
    assert not other.url.startswith(f"{hub.user_url('ben')}/")
    for path in ("api/contents", "api/kernels", "pdl/api/cluster"):
        r = ann.get(f"{hub.user_url('ben')}/{path}", timeout=60, allow_redirects=False)
        assert refused(hub, answer_of(r)), (path, answer_of(r))


def test_engines_see_only_their_users_slots(both):
    hub = both
    owners = hub.reservations()
    seen = {}
    for user in WORKERS:
        engines = engines_of(hub, user).values()
        slots = sorted(e["PDL_SLOT"] for e in engines)
        assert slots == sorted(s for s, o in owners.items() if o == user)
        assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in engines) == sorted(s.split(":")[1] for s in slots)
        seen[user] = set(slots)
    assert len(seen["ann"]) == WORKERS["ann"] and len(seen["ben"]) == WORKERS["ben"]
    assert not seen["ann"] & seen["ben"], seen


def test_a_users_engines_get_their_share_of_the_cores_never_a_neighbours(both):
    """The hub splits the machine's cores over its whole pool: ann's engine and ben's
    two each run on their slot's share, never on a neighbour's cores (while the machine
    has a core for each slot of the pool). Before, a server split the cores over its own
    slots only: ann's one engine took every core, ben's two half each."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // len(POOL))
    pinned = {pid: {int(c) for c in e["PDL_CPUS"].split(",")}
              for user in WORKERS for pid, e in engines_of(both, user).items()}
    assert len(pinned) == sum(WORKERS.values()) and all(len(c) == share for c in pinned.values()), pinned
    if len(cores) >= len(POOL):
        taken = [c for pid in pinned for c in pinned[pid]]
        assert len(taken) == len(set(taken)), pinned
    wait_until(lambda: all(os.sched_getaffinity(pid) == c for pid, c in pinned.items()), 30,
               what="the engines to run on their cores only")


def test_distributed_asking_beyond_the_reservation_is_a_usage_error(both):
    kernel = Kernel(both, "ann")
    try:
        assert kernel.execute("%load_ext pdl_magics")["error"] is None
        out = kernel.execute("%%distributed -n 2\nprint('ran on', rank)", timeout=60)
        # IPython shows a UsageError as this one line on stderr, without a traceback
        assert out["stderr"] == "UsageError: -n 2 is not available: 1 worker(s) reserved for you; use -n 1..1\n"
        assert out["stdout"] == "", out
    finally:
        kernel.close()


@pytest.mark.parametrize("body, named", [
    ({"image": "evil", "workers": 1}, "'image'"),
    ({"volumes": {"/": "/host"}}, "'volumes'"),
    ({"user_options": {"mounts": [{"source": "/", "target": "/host"}], "workers": 1}}, "'mounts'"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}, "cmd": ["/bin/sh"]}, "'cmd', 'env'"),
])
def test_spawn_options_other_than_workers_are_refused_before_anything_starts(hub, body, named):
    token = hub.user_token("cat")
    r = hub.api("POST", "/users/cat/server", token=token, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["message"] == f"spawn option not allowed: {named}; {VALID}"
    assert "cat" not in hub.reservations().values()
    assert hub.processes_of("cat") == {} and not hub.home("cat").exists()
    assert not hub.server_ready("cat") and "cat" not in hub.running_servers()


def test_after_refused_options_a_plain_request_still_spawns(hub):
    token = hub.user_token("cat")
    assert hub.api("POST", "/users/cat/server", token=token, json={"workers": 1}).status_code in (201, 202)
    hub.wait_ready("cat")
    assert list(hub.reservations().values()).count("cat") == 1
    assert hub.api("DELETE", "/users/cat/server", token=token).status_code in (202, 204)
    wait_until(lambda: "cat" not in hub.running_servers(), 60, what="cat's server to stop")
    wait_until(lambda: not hub.processes_of("cat"), 10, what="cat's processes to exit")
    assert "cat" not in hub.reservations().values()


#: Public text that IPython copies into every profile with ``shutil.copy``, which keeps
#: the installed file's mode (0644) whatever the umask; the 0700 directories above it
#: keep it from other users.
PUBLIC_COPIES = ("profile/startup/README",)


def _loose(path) -> str | None:
    """How ``path`` is too open: a directory other than 0700, a file readable by others."""
    mode = stat.S_IMODE(path.lstat().st_mode)
    if path.is_dir() and not path.is_symlink():
        return None if mode == 0o700 else f"{path} is a directory with mode {mode:04o}, not 0700"
    return None if not mode & 0o077 else f"{path} has mode {mode:04o} (group/other bits)"


def test_hub_secrets_are_private(hub):
    state = hub.state_dir
    secrets = [state / name for name in ("password", "jupyterhub_cookie_secret", "jupyterhub.sqlite")]
    assert all(p.is_file() for p in secrets)
    assert [problem for p in [state, *secrets] if (problem := _loose(p))] == []


def test_cluster_files_are_private_and_every_process_has_umask_0077(both):
    """Needs the user's server and engine boot to set umask 0o077 before writing anything."""
    hub = both
    home = hub.home("ann")
    cluster = home / ".pdl" / "cluster"
    files = sorted(p for p in cluster.rglob("*") if p.relative_to(cluster).as_posix() not in PUBLIC_COPIES)
    assert any(p.name.startswith("ipcontroller-") and p.suffix == ".json" for p in files), \
        f"no connection files in {cluster}: {files}"
    loose = [problem for p in [home, home / ".pdl", cluster, *files] if (problem := _loose(p))]
    assert loose == [], "\n".join(loose)

    processes = hub.lasting_processes_of("ann")
    assert {"pdl-singleuser", "server", "controller", "engine"} <= set(processes.values()), processes
    umasks = {f"{role} {pid}": proc_status(pid, "Umask") for pid, role in processes.items()}
    assert {who: umask for who, umask in umasks.items() if umask != "0077"} == {}
