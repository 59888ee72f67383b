"""pdl_spawner/hub/public_url.py: which public URLs the hub takes, and its one-line refusal."""

from __future__ import annotations

import pytest

from pdl_spawner.hub.public_url import default_public_url, public_url_problem


@pytest.mark.parametrize("url", ["http://localhost:8000", "https://hub.lab.example", "https://hub.lab.example/",
                                 "http://pdl-hub.test:8000", default_public_url(8123)])
def test_a_host_name_with_an_optional_port_is_taken(url):
    assert public_url_problem(url) is None


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://[::1]:8000", "ftp://hub.lab.example", "hub.lab.example",
                                 "http://hub.lab.example/jupyter", "http://hub.lab.example?x=1", "http://:8000",
                                 "http://hub.lab.example:99999", "http://user:pw@hub.lab.example", "http://hub_lab.example",
                                 "http://" + "a" * 64 + ".example", ""])
def test_anything_else_is_refused_in_one_line_naming_what_is_valid(url):
    problem = public_url_problem(url)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("PDL_PUBLIC_URL must be http(s)://NAME[:PORT]") and f"got {url[:40]!r}"[:-1] in problem


def test_a_long_value_is_quoted_in_at_most_60_characters():
    problem = public_url_problem("http://" + "a." * 5_000 + "example")
    assert problem is not None and len(problem) < 300
