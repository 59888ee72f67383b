"""What the notebook side lets through of ipyparallel's warnings (pdl_magics/engines.py):
the lookup of the controller's empty location, which nobody can act on, is quiet; a
warning about a named host, or any other, still reaches the user."""

from __future__ import annotations

import warnings

import pytest

from pdl_magics.engines import quiet_empty_location_lookup

pytestmark = pytest.mark.unit


def warned(message: str) -> list[str]:
    """What warnings reach the user when ``message`` is warned during a client's connect."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_empty_location_lookup():
            warnings.warn(message, RuntimeWarning)
    return [str(w.message) for w in seen]


def test_the_empty_location_lookup_is_quiet():
    assert warned("IPython could not determine IPs for : [Errno 3] Unknown server error") == []


@pytest.mark.parametrize("message", [
    "IPython could not determine IPs for gpu2: [Errno -2] Name or service not known",
    "IPython could not determine public IPs",
    "Controller appears to be listening on localhost, but not on this machine.",
])
def test_real_problems_still_surface(message):
    assert warned(message) == [message]


def test_the_filter_ends_with_the_connect():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_empty_location_lookup():
            pass
        warnings.warn("IPython could not determine IPs for : later", RuntimeWarning)
    assert len(seen) == 1
