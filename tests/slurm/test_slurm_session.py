"""On Slurm the job's time limit is the session (pdl_spawner/core/session_limit.py's
``ends_grants`` of its source of workers; the form's line, pdl_spawner/slurm/choices.py): the hub's
session limit does not apply, and the form says the job's limit where there is no choice."""

from __future__ import annotations

import pytest

from pdl_spawner.slurm.spawner import PDLSlurmSpawner

pytestmark = pytest.mark.unit


def test_on_slurm_the_jobs_time_limit_is_the_session_not_the_hubs_limit():
    spawner = PDLSlurmSpawner(session_limit_s=60)
    spawner.start_session()
    assert spawner.session_ends_at == 0 and spawner.session_form_line() == ""
    assert PDLSlurmSpawner(time_limit=480).session_form_line().startswith(
        "Your job's time limit is 8 h 00 min: your engines are then released")
    assert PDLSlurmSpawner(time_limit=480, max_time_limit=600).session_form_line() == ""  # the form asks for one
