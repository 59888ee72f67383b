"""How a rank's failure reads: one line where a log or a kernel reply names it, the
whole traceback where IPython shows it."""

from __future__ import annotations

import pytest

from pdl_magics import RankFailed
from pdl_magics.errors import ENGINE_DIED

pytestmark = pytest.mark.unit

RED, RESET = "\x1b[0;31m", "\x1b[0m"
TRACEBACK = [
    f"{RED}---------------------------------------------------------------------------{RESET}",
    f"{RED}ValueError{RESET}                                Traceback (most recent call last)",
    f"Cell {RED}In[3], line 3{RESET}\n      1 x = rank\n----> 3     raise ValueError('bad shard')",
    f"{RED}ValueError{RESET}: bad shard",
]


def test_a_rank_failure_is_one_line_without_colours_and_its_traceback_is_still_shown():
    evalue = f"\n  {RED}bad shard{RESET}: rows 10-20 are empty\n{RED}Traceback{RESET} (most recent call last):\n  ..."
    failure = {"ename": "ValueError", "evalue": evalue, "traceback": TRACEBACK}
    e = RankFailed(1, "gpu2", failure, note="(ranks 0, 2 were stopped as a result)")

    assert str(e) == "rank 1 on gpu2 raised ValueError: bad shard: rows 10-20 are empty"
    assert e.evalue == evalue  # the remote value itself is kept as it came

    shown = e._render_traceback_()
    assert shown[0] == "Rank 1 on host gpu2 raised ValueError:"
    assert shown[1:-1] == TRACEBACK  # exactly as the engine formatted it, colours included
    assert shown[-1] == "(ranks 0, 2 were stopped as a result)"


def test_a_dead_engine_is_one_line_too():
    failure = {"ename": ENGINE_DIED, "evalue": "its engine process exited during the cell (killed)\nexit code -9"}
    e = RankFailed(2, "gpu3", failure)
    assert str(e) == "rank 2 on gpu3 died: its engine process exited during the cell (killed)"
    assert e._render_traceback_()[0].startswith("Rank 2 on host gpu3 died: its engine process exited")
