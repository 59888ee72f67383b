"""Hub-side pieces without a hub: the slot ledger, the spawn form, slot pinning."""

from __future__ import annotations

import multiprocessing
from importlib.metadata import entry_points

import pytest

from pdl.slots import cpus_for_slot, engine_env, parse_slot
from pdl_spawner import form
from pdl_spawner.reservations import NotEnoughSlots, SlotLedger

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


def test_not_enough_message_is_one_line_with_what_is_free():
    msg = form.not_enough_message(3, 1, 4, {"alice": 2, "bob": 1}, show_names=False)
    assert "\n" not in msg
    assert "you asked for 3, 1 of 4 are free (3 held by other users)" in msg


@pytest.mark.parametrize("raw", ["0", "-1", "7", "abc", "", "2.5"])
def test_workers_field_rejects_bad_values_naming_the_range(raw):
    with pytest.raises(ValueError, match="from 1 to 6"):
        form.parse_workers({"workers": [raw]}, maximum=6)
    assert form.parse_workers({"workers": ["4"]}, maximum=6) == 4


def test_gpu_slot_sees_only_its_gpu_and_cpu_slots_share_the_cores():
    env = engine_env("gpu:2", pool_size=4, n_cpus=16)
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["PDL_CPUS"] == "8,9,10,11"
    assert env["OMP_NUM_THREADS"] == "4"
    assert engine_env("cpu:1", pool_size=4, n_cpus=16)["CUDA_VISIBLE_DEVICES"] == ""
    assert cpus_for_slot("cpu:3", pool_size=4, n_cpus=2) == [1]
    with pytest.raises(ValueError, match="'gpu:<index>' or 'cpu:<index>'"):
        parse_slot("tpu:0")


def test_spawner_is_registered_and_documents_its_config():
    from pdl_spawner.local import PDLLocalSpawner

    assert entry_points(group="jupyterhub.spawners")["pdl-local"].load() is PDLLocalSpawner
    own = ["pool", "cpu_slots", "default_workers", "max_workers", "reservations_db",
           "system_users", "home_dir_template"]
    traits = PDLLocalSpawner.class_traits(config=True)
    for name in own:
        assert traits[name].help.strip(), f"{name} has no help text"
