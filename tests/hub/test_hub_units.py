"""Hub-side pieces without a hub: the slot ledger, the spawn form, slot pinning, the local
spawner (the Swarm spawner's: tests/swarm/test_swarm_spawner.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from importlib.metadata import entry_points

import pytest
from tornado import web

from pdl.lease import Grant, Refusal
from pdl.slots import cpus_for_slot, engine_env, parse_slot
from lease_double import fake_user as _fake_user
from lease_double import lease_spawner as _lease_spawner
from pdl_spawner.core import form
from pdl_spawner.core.reservations import NotEnoughSlots, SlotLedger

pytestmark = pytest.mark.unit

POOL = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


def test_ledger_reserves_all_or_nothing_and_says_who_holds_the_rest(tmp_path):
    ledger = SlotLedger(tmp_path / "r.sqlite")
    assert ledger.reserve("alice", 3, POOL) == ["cpu:0", "cpu:1", "cpu:2"]
    with pytest.raises(NotEnoughSlots) as e:
        ledger.reserve("bob", 2, POOL)
    assert (e.value.wanted, e.value.free, e.value.holders) == (2, 1, {"alice": 3})
    assert ledger.held_by("bob") == []
    assert ledger.reserve("bob", 1, POOL) == ["cpu:3"]
    assert sorted(ledger.release("alice")) == ["cpu:0", "cpu:1", "cpu:2"]
    assert ledger.reserve("carol", 3, POOL) == ["cpu:0", "cpu:1", "cpu:2"]


def test_ledger_survives_reopening(tmp_path):
    SlotLedger(tmp_path / "r.sqlite").reserve("alice", 2, POOL)
    reopened = SlotLedger(tmp_path / "r.sqlite")
    assert reopened.held_by("alice") == ["cpu:0", "cpu:1"]
    with pytest.raises(NotEnoughSlots):
        reopened.reserve("bob", 3, POOL)


def _grab(args):
    path, owner = args
    try:
        return owner, SlotLedger(path).reserve(owner, 1, POOL)
    except NotEnoughSlots:
        return owner, []


def test_concurrent_processes_never_get_the_same_slot(tmp_path):
    path = str(tmp_path / "r.sqlite")
    SlotLedger(path)
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        results = pool.map(_grab, [(path, f"user{i}") for i in range(12)])
    granted = [slot for _, slots in results for slot in slots]
    assert sorted(granted) == POOL  # every slot given once, to one of the 12 users
    owners = {h.slot: h.owner for h in SlotLedger(path).holdings()}
    assert all(owners[s] == o for o, slots in results for s in slots)


def test_form_names_holders_only_to_admins():
    kwargs = dict(kind="gpu", pool_size=3, free=1, holders={"bob": 2}, default=3, maximum=3)
    assert "bob (2)" in form.render_form(show_names=True, **kwargs)
    user_view = form.render_form(show_names=False, **kwargs)
    assert "bob" not in user_view and "2 held by other users" in user_view
    assert "1 of 3 GPUs free" in user_view and 'max="3"' in user_view


def test_form_shows_the_users_own_limit_and_holding():
    kwargs = dict(kind="gpu", pool_size=3, free=1, holders={"bob": 2}, default=3, maximum=3, show_names=False)
    page = form.render_form(**kwargs, limits="You may hold 2 workers; you hold 0. <Slurm QOS & more>")
    assert '<p class="help-block pdl-limits">You may hold 2 workers; you hold 0. &lt;Slurm QOS &amp; more&gt;</p>' in page
    assert "pdl-limits" not in form.render_form(**kwargs)


def test_not_enough_message_is_one_line_with_what_is_free():
    msg = form.not_enough_message(3, 1, 4, {"alice": 2, "bob": 1}, show_names=False)
    assert "\n" not in msg
    assert msg.endswith("you asked for 3, 1 of 4 are free (3 held by other users). "
                        "Ask for at most 1, or try again when one frees up.")
    # nothing free: no advice to ask for 0
    assert form.not_enough_message(1, 0, 4, {"alice": 4}, show_names=False).endswith(
        "1, 0 of 4 are free (4 held by other users). Try again when one frees up.")


@pytest.mark.parametrize("raw", ["0", "-1", "7", "abc", "", "2.5"])
def test_workers_field_rejects_bad_values_naming_the_range(raw):
    with pytest.raises(ValueError, match="from 1 to 6"):
        form.parse_workers({"workers": [raw]}, maximum=6)
    assert form.parse_workers({"workers": ["4"]}, maximum=6) == 4


@pytest.mark.parametrize("refuse", [
    lambda huge: form.parse_workers({"workers": [huge]}, maximum=6),
    lambda huge: form.requested_workers({"workers": huge}, default=1, maximum=6),
    lambda huge: form.requested_workers({"queue": huge}, default=1, maximum=6),
    lambda huge: form.requested_workers({huge: 1}, default=1, maximum=6),
    lambda huge: form.requested_workers({"workers": 10 ** 10_000}, default=1, maximum=6),
])
def test_a_huge_value_is_quoted_in_a_few_dozen_characters_not_echoed_whole(refuse):
    """A 10 MB value came back whole in the 400 and three times in the hub's log."""
    huge = "9" * 10_000_000
    with pytest.raises(ValueError) as e:
        refuse(huge)
    message = str(e.value)
    assert len(message) < 250 and "\n" not in message, message[:300]
    assert "from 1 to 6" in message
    assert ("... (10000002 characters)" in message) or "too long to show" in message, message


@pytest.mark.parametrize("options, named", [
    ({"image": "evil", "workers": 1}, "'image'"),
    ({"volumes": {"/": "/host"}}, "'volumes'"),
    ({"mounts": [], "env": {}, "cmd": ["sh"]}, "'cmd', 'env', 'mounts'"),
    ({"workers\nimage": 1}, "'workers\\nimage'"),
])
def test_user_options_other_than_workers_are_refused_in_one_line(options, named):
    with pytest.raises(ValueError) as e:
        form.requested_workers(options, default=1, maximum=6)
    message = str(e.value)
    assert message == f"spawn option not allowed: {named}; the options are 'workers', a whole number from 1 to 6, and 'queue', true or false"
    assert "\n" not in message


def test_user_options_give_workers_or_the_default():
    assert form.requested_workers({}, default=2, maximum=6) == 2
    assert form.requested_workers({"workers": 5}, default=2, maximum=6) == 5
    for bad in ({"workers": 7}, {"workers": "3"}, {"workers": True}):
        with pytest.raises(ValueError, match="from 1 to 6"):
            form.requested_workers(bad, default=1, maximum=6)
    with pytest.raises(ValueError, match="must be a JSON object; the options are 'workers'"):
        form.requested_workers(["workers"], default=1, maximum=6)


def test_a_default_above_the_pool_asks_for_the_whole_pool_not_a_refusal(tmp_path):
    """The hub's default of 3 workers on a 2-core machine (a pool of 2 CPU workers): a
    spawn that names no count gets 2, and the form offers 2, instead of a 400."""
    from pdl_spawner.local.spawner import PDLLocalSpawner

    spawner = PDLLocalSpawner(user=_fake_user("alice"), pool=["cpu:0", "cpu:1"], default_workers=3,
                              reservations_db=str(tmp_path / "r.sqlite"))
    spawner.user_options = {}
    assert spawner.requested_workers() == 2
    assert 'value="2"' in asyncio.run(spawner.render_options_form())
    spawner.user_options = {"workers": 3}
    with pytest.raises(web.HTTPError, match="a whole number from 1 to 2"):
        spawner.requested_workers()


def test_a_spawn_that_names_workers_logs_no_unhandled_user_options_warning(tmp_path, caplog):
    """JupyterHub warns "Received unhandled user_options" when a spawner has no
    apply_user_options hook; PDL applies ``workers`` and ``queue`` itself."""
    import logging

    from pdl_spawner.local.spawner import PDLLocalSpawner

    log = logging.getLogger("pdl-test-spawner")
    spawner = PDLLocalSpawner(user=_fake_user("ann"), pool=POOL, reservations_db=str(tmp_path / "r.sqlite"), log=log)
    spawner.user_options = {"workers": 2, "queue": True}
    with caplog.at_level(logging.DEBUG, logger=log.name):
        asyncio.run(spawner._run_apply_user_options(spawner.user_options))  # as JupyterHub's spawn does
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for m in warned if "user_options" in m or "user option" in m.lower()] == [], warned
    assert spawner.requested_workers() == 2  # and the options still mean what they did


def test_local_spawner_refuses_an_image_before_reserving_or_starting(tmp_path):
    from pdl_spawner.local.spawner import PDLLocalSpawner

    db = tmp_path / "r.sqlite"
    spawner = PDLLocalSpawner(user=_fake_user("alice"), pool=POOL, reservations_db=str(db))
    spawner.user_options = {"image": "evil", "workers": 1}
    with pytest.raises(web.HTTPError) as e:
        asyncio.run(spawner.start())
    assert e.value.status_code == 400 and "the options are 'workers'" in e.value.reason
    assert SlotLedger(db).holdings() == [] and spawner.pid == 0 and spawner.slots == []


def test_local_spawner_gives_each_server_ports_in_a_row_that_nothing_else_holds(tmp_path):
    """Guards ``HostServer.pick_port``: a block of PORTS_A_SERVER ports, the server's and its
    controller's (told in the contract), none given to another server or bound by anything
    else; the block goes back with the workers."""
    import socket

    from pdl.contract import ServerContract
    from pdl_spawner.host.server import PORTS_A_SERVER
    from pdl_spawner.local.spawner import PDLLocalSpawner

    low, block = 29600, PORTS_A_SERVER
    spawner = PDLLocalSpawner(user=_fake_user("alice"), pool=POOL, reservations_db=str(tmp_path / "r.sqlite"),
                              port_range=(low, low + 3 * block + 2), system_users=False)
    PDLLocalSpawner._ports["bob"] = low + block  # given to bob's server, which may not listen yet
    try:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", low + 5))  # something else holds a port of the first block
            spawner.port = spawner.pick_port()
        assert spawner.port == low + 2 * block
        told = ServerContract.from_env(spawner.server_contract().env())
        assert told.controller_ports == tuple(range(low + 2 * block + 1, low + 3 * block))
        asyncio.run(spawner.workers.release())
        assert PDLLocalSpawner._ports == {"bob": low + block}
    finally:
        PDLLocalSpawner._ports.clear()
    with pytest.raises(Exception, match="port_range must be"):
        PDLLocalSpawner(user=_fake_user("alice"), port_range=(80, 90))


def test_gpu_slot_sees_only_its_gpu_and_cpu_slots_share_the_cores():
    env = engine_env("gpu:2", ["gpu:0", "gpu:1", "gpu:2", "gpu:3"], range(16))
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["PDL_CPUS"] == "8,9,10,11"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # slot numbers are nvidia-smi's
    assert env["OMP_NUM_THREADS"] == "4"
    assert engine_env("cpu:1", ["cpu:0", "cpu:1"], range(16))["CUDA_VISIBLE_DEVICES"] == ""
    assert cpus_for_slot("cpu:3", ["cpu:0", "cpu:1", "cpu:2", "cpu:3"], [0, 1]) == [1]
    with pytest.raises(ValueError, match="'gpu:<index>', 'mig:<index>' or 'cpu:<index>'"):
        parse_slot("tpu:0")


def test_the_cores_are_split_over_the_whole_pool_so_no_two_slots_share_one():
    """By the slot's place in the machine's pool, not its number: one user's slot and
    their neighbour's never share a core (the server of a user holding cpu:2 of a pool
    of 4 on 8 cores once took all 8, as if the pool were its own slots), a whole GPU
    and a MIG device with the same number neither, and only the cores the hub may use
    (its affinity) are handed out."""
    pool = ["gpu:1", "mig:0", "mig:1", "mig:2"]
    split = [cpus_for_slot(slot, pool, range(8)) for slot in pool]
    assert split == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert cpus_for_slot("mig:1", pool, [4, 5, 6, 7, 12, 13, 14, 15]) == [12, 13]
    assert cpus_for_slot("cpu:2", ["cpu:0", "cpu:1", "cpu:2", "cpu:3"], range(8)) == [4, 5]
    assert cpus_for_slot("cpu:9", ["cpu:0", "cpu:1"], range(6)) == [4, 5]  # not in the pool: after its last


def test_the_default_cpu_pool_is_one_worker_per_core_and_never_oversubscribes(monkeypatch):
    """Without GPUs the pool has one slot per core: every engine of it together runs at
    most as many threads as the machine has cores (4 slots on 2 cores trained at half
    the speed of 2)."""
    import pdl.slots

    monkeypatch.setattr(pdl.slots, "detect_gpus", lambda: [])
    for cores in (1, 2, 3, 8):
        monkeypatch.setattr(pdl.slots, "usable_cores", lambda: list(range(cores)))
        pool = pdl.slots.default_pool()
        assert pool == [f"cpu:{i}" for i in range(cores)]
        threads = [int(engine_env(slot, pool)["OMP_NUM_THREADS"]) for slot in pool]
        assert sum(threads) <= cores
        assert sorted(c for slot in pool for c in cpus_for_slot(slot, pool, range(cores))) == list(range(cores))
    assert pdl.slots.default_pool(cpu_slots=3) == ["cpu:0", "cpu:1", "cpu:2"]  # the admin's own count


def test_spawner_is_registered_and_documents_its_config():
    from pdl_spawner.local.spawner import PDLLocalSpawner

    assert entry_points(group="jupyterhub.spawners")["pdl-local"].load() is PDLLocalSpawner
    own = ["pool", "cpu_slots", "default_workers", "max_workers", "reservations_db",
           "system_users", "account_prefix", "homes_root", "skeleton_dir", "gpu_device_template",
           "home_dir_template", "port_range"]
    traits = PDLLocalSpawner.class_traits(config=True)
    for name in own:
        assert traits[name].help.strip(), f"{name} has no help text"


def test_the_queue_on_the_spawn_form_names_waiters_only_to_admins():
    kwargs = dict(kind="cpu", pool_size=2, free=0, holders={"alice": 2}, default=1, maximum=2)
    admin = form.render_form(**kwargs, show_names=True, waiting=[("bob", 1), ("carol", 2)])
    user = form.render_form(**kwargs, show_names=False, waiting=[("bob", 1), ("carol", 2)])
    assert "Queue: bob (1), carol (2)." in admin and 'name="queue"' in admin
    assert "2 users are waiting." in user and "bob" not in user
    assert 'name="queue"' not in form.render_form(**kwargs, show_names=True)  # a spawner without a queue
    assert form.wants_queue({"queue": ["on"]}) and not form.wants_queue({})
    assert form.requested_workers({"workers": 2, "queue": True}, default=1, maximum=2) == 2
    with pytest.raises(ValueError, match="'queue' must be true or false, got 'yes'"):
        form.requested_workers({"workers": 1, "queue": "yes"}, default=1, maximum=2)
    message = form.queue_message(2, 3, 0, 4, {"alice": 4}, show_names=False)
    assert message == ("Waiting for 2 workers: number 3 in the queue; 0 of 4 are free (4 held by other users). "
                       "Cancel to leave the queue.")
    # a spawn may join the queue; a cell asking its engines back may not, and is told what to do
    assert form.queue_first_message(2).endswith("Tick 'wait in the queue' to join it.")
    assert form.queue_first_message(1, "GPUs", spawning=False) == (
        "Not enough free GPUs for you now: 1 user is waiting in the queue, first come, first served. "
        "Run the cell again once they have been served.")


RELEASED = {"released": {"reason": "engines idle for 9 s", "workers": 2, "slots": ["cpu:0", "cpu:1"]},
            "want": None, "grant": None}


def test_engines_asked_back_while_others_wait_are_refused_with_advice_for_a_cell(tmp_path):
    from pdl_spawner.core.wait_queue import WaitQueue

    spawner = _lease_spawner(tmp_path, {**RELEASED, "want": {"workers": 1}})
    WaitQueue(spawner.reservations_db).join("bob", "bob", 2)  # bob waits for two slots, which are free

    asyncio.run(spawner.tend_lease())
    assert spawner.fetch_lease.answers == [Refusal(
        "Not enough free workers for you now: 1 user is waiting in the queue, first come, first served. "
        "Run the cell again once they have been served.")]
    assert SlotLedger(spawner.reservations_db).holdings() == []  # nothing was taken ahead of bob


@pytest.mark.parametrize("wanted", [3, -1, 0, "2", 1.5, None, True])
def test_a_lease_request_gets_no_more_workers_than_a_spawn_could(tmp_path, wanted):
    """Guards ``PDLLocalSpawner.tend_lease`` passing the request through ``checked_workers``
    (the same limit as the spawn form): a user's server asking back 3 workers past
    max_workers=2, or -1, gets a one-line refusal and no slot."""
    spawner = _lease_spawner(tmp_path, {**RELEASED, "want": {"workers": wanted}}, max_workers=2)
    asyncio.run(spawner.tend_lease())
    assert spawner.fetch_lease.answers == [Refusal(f"workers must be a whole number from 1 to 2, got {wanted!r}")]
    assert SlotLedger(spawner.reservations_db).holdings() == []


def test_a_reclaim_is_logged_in_the_hubs_words_not_the_users(tmp_path):
    """Guards ``tend_lease`` logging ``idle_reason(...)`` instead of the lease's reason: a
    reason with a newline would forge a line of the hub's log and of the admin view."""
    spawner = _lease_spawner(tmp_path, {**RELEASED, "released": {
        "reason": "idle\n[I 2026 JupyterHub] admin logged in", "workers": 2, "slots": []}})
    SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    asyncio.run(spawner.tend_lease())
    [reclaim] = SlotLedger(spawner.reservations_db).reclaims()
    assert reclaim.reason == "engines idle for 9 s" and reclaim.slots == ["cpu:0", "cpu:1"]


def test_without_idle_reclaim_a_release_is_not_logged_as_idleness(tmp_path):
    """Guards ``idle_reason(0)``: a server released at its session's end, on a hub with no
    idle timeout, is not logged as "engines idle for 0 s"."""
    spawner = _lease_spawner(tmp_path, RELEASED, engine_idle_timeout=0)
    SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    asyncio.run(spawner.tend_lease())
    [reclaim] = SlotLedger(spawner.reservations_db).reclaims()
    assert reclaim.reason == "engines given back by their server"


def test_a_granted_request_gets_slots_from_the_ledger(tmp_path):
    spawner = _lease_spawner(tmp_path, {**RELEASED, "want": {"workers": 2}})
    SlotLedger(spawner.reservations_db).reserve("bob", 1, spawner.pool)
    asyncio.run(spawner.tend_lease())
    assert spawner.fetch_lease.answers == [Grant(workers=2, slots=("cpu:1", "cpu:2"))]
    assert spawner.slots == ["cpu:1", "cpu:2"]


def test_workers_just_granted_are_not_reclaimed_before_the_server_takes_them_up(tmp_path):
    """Guards ``SpawnerCore.tend_lease`` waiting while its answer is unread: the server
    takes a grant up within seconds, and until then its lease still says "released";
    the hub's next look must not reclaim the slots it has just granted."""
    spawner = _lease_spawner(tmp_path, {**RELEASED, "want": {"workers": 2},
                                        "grant": {"workers": 2, "slots": ["cpu:0", "cpu:1"], "job": 0}})
    SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    asyncio.run(spawner.tend_lease())
    assert SlotLedger(spawner.reservations_db).reclaims() == [] and spawner.fetch_lease.answers == []
    assert sorted(h.slot for h in SlotLedger(spawner.reservations_db).holdings()) == ["cpu:0", "cpu:1"]


@pytest.mark.parametrize("n", [0, -1, True, 1.0, "1"])
def test_the_ledger_itself_refuses_counts_below_one(tmp_path, n):
    """Guards the check at the top of ``SlotLedger.reserve``: whoever calls it."""
    ledger = SlotLedger(tmp_path / "r.sqlite")
    with pytest.raises(ValueError, match="at least 1"):
        ledger.reserve("alice", n, POOL)
    assert ledger.holdings() == []


def test_clear_state_frees_a_reservation_the_state_never_recorded(tmp_path):
    """Guards ``PDLLocalSpawner.clear_state`` releasing by owner: after a hub crash between
    the reservation and JupyterHub saving the state, the restarted hub's spawner has no
    slots in its state, and clearing it must still free what the ledger holds."""
    from pdl_spawner.hub.db_thread import submit

    spawner = _lease_spawner(tmp_path, {})
    SlotLedger(spawner.reservations_db).reserve("alice", 2, spawner.pool)
    spawner.load_state({})
    spawner.clear_state()
    submit(lambda: None).result(timeout=30)  # the release was queued before this
    assert SlotLedger(spawner.reservations_db).holdings() == []


@pytest.mark.unit
@pytest.mark.parametrize("value", [0, -1, True, "1048576", 1.5])
def test_the_request_body_limit_takes_a_positive_number_of_bytes_only(value):
    """Guards pdl_spawner.hub.request_limits: a limit of 0 (or a string from the environment)
    would refuse every request, or none, silently."""
    from pdl_spawner.hub.request_limits import limit_request_bodies

    with pytest.raises(ValueError, match="positive number of bytes"):
        limit_request_bodies(value)


@pytest.mark.unit
def test_a_missing_runtime_root_is_made_open_to_the_accounts_whatever_the_umask(tmp_path):
    """On a machine without systemd-logind there is no /run/user: the hub (umask 0077)
    made it 0700, and every user's server then failed with PermissionError on
    /run/user/<uid>/jupyter (seen on a GPU machine)."""
    import os
    import pwd
    import stat

    from pdl_spawner.accounts.unix_accounts import ensure_runtime_dir

    if os.geteuid() != 0:
        pytest.skip("gives the folder to another account: needs root")
    nobody = pwd.getpwnam("nobody")
    before = os.umask(0o077)
    try:
        made = ensure_runtime_dir(nobody, tmp_path / "run" / "user")
    finally:
        os.umask(before)
    for folder in (tmp_path / "run", tmp_path / "run" / "user"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    assert made == tmp_path / "run" / "user" / str(nobody.pw_uid)
    assert made.stat().st_uid == nobody.pw_uid and stat.S_IMODE(made.stat().st_mode) == 0o700


@pytest.mark.unit
def test_pdl_runs_users_only_as_accounts_its_own_hub_made(tmp_path):
    """The attack (issue 27, 6): the account of a hub user is ``<prefix><name>``, so a
    prefix of ``""`` ran hub user ``root`` or ``daemon`` as that account, and an existing
    account (a lab member's own login, or another hub's user with the same prefix) was
    taken as it was. Now uid 0, system accounts and accounts this hub did not record
    making are refused in one line; two hubs never share one."""
    import os
    import pwd
    import re
    import secrets
    import stat
    import subprocess

    from pdl_spawner.accounts.unix_accounts import ForeignAccount, accounts_made, ensure_account, uid_min

    if os.geteuid() != 0:
        pytest.skip("makes Unix accounts: needs root")
    hub_a, hub_b, homes = tmp_path / "hub-a" / "accounts", tmp_path / "hub-b" / "accounts", tmp_path / "homes"
    for folder in (hub_a.parent, hub_b.parent, homes):
        folder.mkdir()
    prefix = f"t{secrets.token_hex(2)}-"
    lab_member, ours = f"{prefix}own", f"{prefix}ann"
    try:
        for name, words in (("root", "is root's (uid 0)"), ("daemon", "is a system account")):
            with pytest.raises(ForeignAccount, match=re.escape(words)):
                ensure_account(name, homes, hub_a)
        subprocess.run(["useradd", "--no-create-home", lab_member], check=True)
        with pytest.raises(ForeignAccount) as refused:
            ensure_account(lab_member, homes, hub_a)
        assert "exists but this hub did not make it" in str(refused.value) and "\n" not in str(refused.value)
        assert not hub_a.exists()

        entry = ensure_account(ours, homes, hub_a)  # hub A makes its own account
        assert entry.pw_uid >= uid_min() and accounts_made(hub_a) == {ours: entry.pw_uid}
        assert stat.S_IMODE(hub_a.stat().st_mode) == 0o600
        assert ensure_account(ours, homes, hub_a).pw_uid == entry.pw_uid  # and uses it again
        with pytest.raises(ForeignAccount, match="this hub did not make it"):
            ensure_account(ours, homes, hub_b)  # another hub, same prefix
        hub_a.write_text(f"{ours} {entry.pw_uid + 1}\n")  # the name, but another uid: not the account it made
        with pytest.raises(ForeignAccount, match="this hub did not make it"):
            ensure_account(ours, homes, hub_a)
    finally:
        for name in (lab_member, ours):
            subprocess.run(["userdel", "--remove", name], capture_output=True)
    assert not any(p.pw_name in (lab_member, ours) for p in pwd.getpwall())


def test_a_spawn_without_free_ports_says_who_holds_them(tmp_path):
    """Issue 27 (5): "503 no free port" named nobody. It names the servers of this hub, the
    accounts that listen on the rest of port_range and the sockets bound there."""
    import pwd
    import socket

    from pdl_spawner.host.server import PORTS_A_SERVER
    from pdl_spawner.local.spawner import PDLLocalSpawner

    low, block = 29700, PORTS_A_SERVER
    high = low + 2 * block - 1
    spawner = PDLLocalSpawner(user=_fake_user("alice"), pool=POOL, reservations_db=str(tmp_path / "r.sqlite"),
                              port_range=(low, high))
    PDLLocalSpawner._ports["bob"] = low  # given to bob's server
    try:
        with socket.socket() as listening, socket.socket() as bound:
            listening.bind(("127.0.0.1", high))
            listening.listen()
            bound.bind(("127.0.0.1", high - 1))
            with pytest.raises(web.HTTPError) as refused:
                spawner.pick_port()
    finally:
        PDLLocalSpawner._ports.clear()
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert refused.value.status_code == 503
    assert refused.value.reason == (
        f"no free ports for the server in port_range {low}-{high} (each server takes {block} in a row, "
        f"its own and its controller's): the servers of bob hold {block}; {me} holds 1; "
        "other sockets (bound, not listening) hold 1")


def test_a_mig_slot_opens_its_gpus_node_and_its_own_instances_capability_nodes(tmp_path):
    from mig_machine import MIG_TYPE, fake_nvidia_smi, write_minors

    from pdl_spawner.local.spawner import PDLLocalSpawner

    write_minors(tmp_path / "mig-minors")
    spawner = PDLLocalSpawner(user=_fake_user("alice"), pool=["gpu:1", "mig:0", "mig:1"],
                              reservations_db=str(tmp_path / "r.sqlite"),
                              nvidia_smi=fake_nvidia_smi(tmp_path / "smi", readings="0, 55\n1, 0\n"),
                              gpu_device_template=str(tmp_path / "nvidia{index}"),
                              mig_minors_file=str(tmp_path / "mig-minors"),
                              mig_cap_template=str(tmp_path / "cap{minor}"))
    asyncio.run(spawner.workers.read_capacity())
    assert spawner.workers.kind == "gpu" and spawner.workers.gpu_types_for({}) == [MIG_TYPE, "Tesla T4"]
    assert spawner.gpu_nodes(["mig:1"]) == [tmp_path / "nvidia0", tmp_path / "cap21", tmp_path / "cap22"]
    assert spawner.gpu_nodes(spawner.pool) == [tmp_path / n for n in
                                               ["nvidia1", "nvidia0", "cap12", "cap13", "cap21", "cap22"]]
    spawner.slots = ["gpu:1"]
    assert asyncio.run(spawner.workers.gpu_use()) == [0.0]
    spawner.slots = ["gpu:1", "mig:0"]  # no use is read of a MIG device: the server's is unknown, never idle
    assert asyncio.run(spawner.workers.gpu_use()) is None


def test_a_server_that_answers_every_long_poll_at_once_is_looked_at_no_more_than_four_times_a_second(tmp_path):
    """The attack: alice's own server (hers to replace) answers each of the hub's long
    polls at once with a lease of a newer version, to keep the hub's event loop busy
    with her lease. Guards ``IdleEngines._lease_loop``'s gap between looks."""
    from pdl_spawner.core.idle_engines import LEASE_LOOK_GAP_S

    spawner = _lease_spawner(tmp_path, {})
    answers = []

    async def always_newer(body=None, part="", query="", wait_s=0.0):
        answers.append(query)
        return {"released": None, "want": None, "grant": None, "version": len(answers), "epoch": "hers"}

    spawner.fetch_lease = always_newer

    async def watch_for(seconds):
        spawner.watch_lease()
        await asyncio.sleep(seconds)
        spawner.unwatch_lease()

    asyncio.run(watch_for(2.0))
    polls = [q for q in answers if q]  # each look: one long poll, then tend_lease's read
    assert 4 <= len(polls) <= 2.0 / LEASE_LOOK_GAP_S + 1, answers
