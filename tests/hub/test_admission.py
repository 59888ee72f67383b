"""A spawn request answered before JupyterHub prepares the spawn (pdl_spawner/core/admission.py,
``SpawnerCore.admit_spawn``, pdl_spawner/hub/spawn_routes.py): a burst is admitted only up to
what is free, admissions end at the take, and JupyterHub's spawn routes are PDL's.

The burst through a real hub is tests/hub/test_hub_load.py's; the refusal through the
REST API and the form, tests/hub/test_hub.py's."""

from __future__ import annotations

import asyncio

import pytest
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.handlers.pages import SpawnHandler
from tornado import web

from lease_double import fake_user
from pdl_spawner.core.admission import ADMISSIONS, Admissions
from pdl_spawner.hub import spawn_routes

pytestmark = pytest.mark.unit

POOL = [f"cpu:{i}" for i in range(6)]
#: The servers of this module's spawners, whose admissions (the hub process's) each test ends.
MADE: list[str] = []


@pytest.fixture(autouse=True)
def no_admission_left():
    yield
    while MADE:
        ADMISSIONS.drop(MADE.pop())


def spawner_of(tmp_path, user: str):
    from pdl_spawner.local.spawner import PDLLocalSpawner

    spawner = PDLLocalSpawner(user=fake_user(user), system_users=False, reservations_db=str(tmp_path / "r.sqlite"),
                              home_dir_template=str(tmp_path / "home" / "{username}"), pool=POOL)
    MADE.append(spawner.owner_key)
    return spawner


async def answers(spawners, options) -> list[str]:
    async def one(spawner):
        try:
            await spawner.admit_spawn(options)
        except web.HTTPError as e:
            return f"{e.status_code} {e.reason}"
        return "admitted"

    return list(await asyncio.gather(*(one(s) for s in spawners)))


def test_a_burst_is_admitted_up_to_what_is_free_and_the_rest_refused_at_once(tmp_path):
    spawners = [spawner_of(tmp_path, f"u{i}") for i in range(5)]

    async def burst():
        said = await answers(spawners, {"workers": 2})
        # the admitted take for real; each admission ends with its take
        taken = [await s.reserve_workers() for s, a in zip(spawners, said) if a == "admitted"]
        return said, taken

    said, taken = asyncio.run(burst())
    assert said.count("admitted") == 3, said
    refused = [a for a in said if a != "admitted"]
    assert refused == ["409 Not enough free workers: you asked for 2, 0 of 6 are free (6 held by other users). "
                       "Try again when one frees up."] * 2
    assert sorted(slot for slots in taken for slot in slots) == POOL
    assert len(ADMISSIONS) == 0


def test_admitted_workers_count_until_taken_and_not_after(tmp_path):
    ann, bob = spawner_of(tmp_path, "ann"), spawner_of(tmp_path, "bob")

    async def run():
        await ann.admit_spawn({"workers": 5})
        first = await answers([bob], {"workers": 2})  # ann's 5 are promised: 1 free
        await ann.reserve_workers()
        second = await answers([bob], {"workers": 1})  # counted once, as the ledger's
        await bob.reserve_workers()
        return first, second

    first, second = asyncio.run(run())
    assert first == ["409 Not enough free workers: you asked for 2, 1 of 6 are free (5 held by other users). "
                     "Ask for at most 1, or try again when one frees up."]
    assert second == ["admitted"] and len(ADMISSIONS) == 0


def test_bad_options_are_refused_before_anything_is_admitted(tmp_path):
    said = asyncio.run(answers([spawner_of(tmp_path, "ann")], {"workers": 2, "image": "evil"}))
    assert said[0].startswith("400 spawn option not allowed: 'image'; the options are 'workers'")
    assert len(ADMISSIONS) == 0


def test_a_spawn_that_waits_in_the_queue_is_left_to_start(tmp_path):
    ann, bob = spawner_of(tmp_path, "ann"), spawner_of(tmp_path, "bob")

    async def run():
        await ann.admit_spawn({"workers": 6})
        said = await answers([bob], {"workers": 1, "queue": True})
        ADMISSIONS.drop(ann.owner_key)
        return said

    assert asyncio.run(run()) == ["admitted"] and len(ADMISSIONS) == 0


def test_an_admission_counts_for_others_of_its_gpu_type_and_no_longer_than_its_hold():
    now = [100.0]
    admissions = Admissions(clock=lambda: now[0], hold_s=30.0)
    admissions.admit("ann/", "ann", 2, "a100")
    admissions.admit("bob/", "bob", 1)
    admissions.admit("bob/big", "bob", 3, "h100")
    assert admissions.held_by_others("eve/") == {"ann": 2, "bob": 4}
    assert admissions.held_by_others("eve/", "a100") == {"ann": 2}  # bob's any-type may land elsewhere
    assert admissions.held_by_others("ann/") == {"bob": 4}  # never its own
    admissions.drop("bob/big")
    first = admissions.admit("eve/", "eve", 1)
    second = admissions.admit("eve/", "eve", 1)  # a second request for the same server
    admissions.drop("eve/", first)  # the first's end leaves the second's admission
    assert admissions.held_by_others("ann/") == {"bob": 1, "eve": 1}
    admissions.drop("eve/", second)
    now[0] += 30.0
    assert admissions.held_by_others("eve/") == {} and len(admissions) == 0


def test_jupyterhubs_spawn_routes_get_pdls_handlers_and_nothing_else_changes():
    routes = [("/hub/api/users/([^/]+)/server", UserServerAPIHandler),
              ("/hub/spawn/([^/]+)", SpawnHandler, {"x": 1}),
              ("/hub/api/users", object)]
    fitted = spawn_routes.fitted_routes(routes)
    assert fitted is routes
    assert fitted == [("/hub/api/users/([^/]+)/server", spawn_routes.PDLUserServerAPIHandler),
                      ("/hub/spawn/([^/]+)", spawn_routes.PDLSpawnHandler, {"x": 1}),
                      ("/hub/api/users", object)]
    assert issubclass(spawn_routes.PDLUserServerAPIHandler, UserServerAPIHandler)


def test_no_route_changes_where_no_hub_runs():
    assert spawn_routes.fit_spawn_routes() is False


def test_an_answer_that_takes_too_long_leaves_the_spawn_to_jupyterhub_and_start(monkeypatch):
    """A cluster slow to say what is free (a Swarm manager under load) must not hold the
    request: past ANSWER_WITHIN_S the spawn goes on as it would without PDL's answer."""
    from types import SimpleNamespace

    async def slow_answer(options):
        await asyncio.sleep(30)

    monkeypatch.setattr(spawn_routes, "ANSWER_WITHIN_S", 0.2)
    spawner = SimpleNamespace(active=False, admit_spawn=slow_answer)
    user = SimpleNamespace(spawners={"": spawner})

    async def ask():
        started = asyncio.get_running_loop().time()
        answer = await spawn_routes.AdmitBeforeSpawn().admit_first(user, "", {"workers": 1})
        return answer, asyncio.get_running_loop().time() - started

    answer, took_s = asyncio.run(ask())
    assert answer is None and took_s < 5

