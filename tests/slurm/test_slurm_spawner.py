"""PDLSlurmSpawner without a cluster: what it does while Slurm is slow or absent (the
spawner on the simulated cluster: tests/slurm/)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from tornado import web

from pdl_spawner.slurm.spawner import PDLSlurmSpawner


def _user(name: str):
    return SimpleNamespace(name=name, admin=False, url=f"/user/{name}/", escaped_name=name, id=1,
                           server=None, spawners={}, settings={}, orm_user=None)


def test_a_slow_slurmctld_never_holds_the_hub_and_its_silence_is_one_line(tmp_path):
    # the one fault: Slurm's scontrol answers after 1 s, with an error (slurmctld down)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\nsleep 1\necho 'slurm_load_partitions: Unable to contact slurm controller' >&2\n"
                        "exit 1\n")
    scontrol.chmod(0o755)
    spawner = PDLSlurmSpawner(user=_user("alice"), slurm_bin_dir=str(tmp_path), max_workers=4,
                              partition="unit-test-silent")
    assert spawner.workers.capacity == 4  # not asked yet: the admin's cap, and no command run

    async def read_while_ticking():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            with pytest.raises(web.HTTPError) as e:
                await spawner.workers.read_capacity()
        finally:
            ticker.cancel()
        return ticks, e.value

    ticks, error = asyncio.run(read_while_ticking())
    assert ticks >= 10, f"the event loop stood still while scontrol ran ({ticks} ticks in about 1 s)"
    assert error.status_code == 503
    assert error.reason == "scontrol: slurm_load_partitions: Unable to contact slurm controller", error.reason
    assert spawner.workers.capacity == 4  # a failed read stores nothing


def test_the_form_reads_the_gpu_type_among_the_chosen_partitions_types():
    """The GPU types offered depend on the partition chosen in the same form: the
    partition is read first (a type only the chosen partition has is accepted, and one
    it lacks refused in one line)."""
    from pdl_spawner.slurm.choices import SlurmChoices

    SlurmChoices.known_gpu_types.update({"unit-cpu": [], "unit-gpu": ["a100", "t4"]})
    try:
        spawner = PDLSlurmSpawner(user=_user("alice"), partitions=["unit-cpu", "unit-gpu"], max_workers=4)
        options = spawner.options_from_form({"workers": ["1"], "partition": ["unit-gpu"], "gpu_type": ["t4"]})
        assert options == {"workers": 1, "partition": "unit-gpu", "gpu_type": "t4"}
        with pytest.raises(web.HTTPError, match="gpu_type must be one of"):
            spawner.options_from_form({"workers": ["1"], "partition": ["unit-gpu"], "gpu_type": ["h100"]})
    finally:
        for partition in ("unit-cpu", "unit-gpu"):
            SlurmChoices.known_gpu_types.pop(partition, None)
