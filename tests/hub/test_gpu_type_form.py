"""The spawn form's GPU type choice (pdl_spawner/core/form.py), with each type's free
count, and its checks; no cluster."""

from __future__ import annotations

import pytest

from pdl_spawner.core.form import check_gpu_type, parse_gpu_type, render_gpu_types

pytestmark = pytest.mark.unit

FREE = {"": (3, 4), "a100": (2, 2), "t4": (1, 2)}


def test_the_form_offers_any_type_and_each_type_with_its_free_count():
    html = render_gpu_types(FREE)
    assert '<select id="pdl-gpu-type" name="gpu_type"' in html
    assert '<option value="">Any type (3 of 4 free)</option>' in html
    assert '<option value="a100">a100 (2 of 2 free)</option>' in html
    assert '<option value="t4">t4 (1 of 2 free)</option>' in html
    assert render_gpu_types({"": (1, 1), "a100": (1, 1)}) == ""  # one type: nothing to choose
    assert "&lt;b&gt;" in render_gpu_types({"": (1, 2), "<b>": (1, 1), "t4": (0, 1)})  # the admin's names, escaped


def test_a_type_not_offered_is_refused_in_one_line_naming_the_valid_ones():
    assert parse_gpu_type({"gpu_type": ["t4"]}, ["a100", "t4"]) == {"gpu_type": "t4"}
    assert parse_gpu_type({"gpu_type": [""]}, ["a100", "t4"]) == {}  # any type
    assert parse_gpu_type({}, ["a100", "t4"]) == {}
    assert parse_gpu_type({"gpu_type": ["h100"]}, ["a100"]) == {}  # no choice offered: nothing read
    with pytest.raises(ValueError) as refused:
        parse_gpu_type({"gpu_type": ["h100"]}, ["a100", "t4"])
    assert str(refused.value) == "gpu_type must be one of 'a100', 't4', or '' for any, got 'h100'"
    with pytest.raises(ValueError, match="gpu_type must be one of"):
        check_gpu_type(3, ["a100", "t4"])
