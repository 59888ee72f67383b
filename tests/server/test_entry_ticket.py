"""Entry tickets (pdl/entry_ticket.py): the hub signs, a server checks with the hub's
public key only, and nothing but the hub's own ticket for that server, in time, passes."""

from __future__ import annotations

import pytest

from pdl import entry_ticket

#: Two hubs' cookie secrets (fixed: the test's names must be the same in every process of a run)
SECRET, OTHER_SECRET = bytes(range(32)), bytes(range(32, 64))
NOW = 1_800_000_000.0


def test_the_hubs_ticket_for_the_server_passes_until_it_expires():
    ticket, key = entry_ticket.issue(SECRET, "ann", NOW), entry_ticket.public_key(SECRET)
    assert entry_ticket.valid(key, "ann", ticket, NOW)
    assert entry_ticket.valid(key, "ann", ticket, NOW + entry_ticket.LIFETIME_S)
    assert not entry_ticket.valid(key, "ann", ticket, NOW + entry_ticket.LIFETIME_S + 1)


#: (what it is, the ticket, made when the test runs) that ann's server must not let pass
NOT_PASSING = [
    ("another user's", lambda: entry_ticket.issue(SECRET, "ben", NOW)),
    ("another hub's", lambda: entry_ticket.issue(OTHER_SECRET, "ann", NOW)),
    ("a later expiry, same signature", lambda: "1800000090" + entry_ticket.issue(SECRET, "ann", NOW)[10:]),
    ("from far ahead", lambda: entry_ticket.issue(SECRET, "ann", NOW + 3600)),
    ("no signature", lambda: f"{int(NOW) + 30}."),
    ("not base64", lambda: f"{int(NOW) + 30}.***"),
    ("no expiry", lambda: "abc"),
    ("huge", lambda: "1" * 100_000),
    ("empty", lambda: ""),
]


@pytest.mark.parametrize("what, ticket", [pytest.param(*case, id=case[0]) for case in NOT_PASSING])
def test_nothing_but_the_hubs_own_ticket_for_that_server_passes(what, ticket):
    assert not entry_ticket.valid(entry_ticket.public_key(SECRET), "ann", ticket(), NOW), what


def test_a_server_told_no_key_or_a_broken_one_lets_no_ticket_pass():
    ticket = entry_ticket.issue(SECRET, "ann", NOW)
    assert not entry_ticket.valid("", "ann", ticket, NOW)
    assert not entry_ticket.valid("not-a-key", "ann", ticket, NOW)
