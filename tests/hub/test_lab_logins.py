"""The lab's own accounts (pdl_spawner/accounts/lab_logins.py, unix_accounts.lab_account):
a login through the machine's real PAM with the account's own password, PDL's lockout
and one-check-at-a-time around it, and which existing accounts a hub user may run as.
The accounts and the group are real, made here with useradd and removed after (root)."""

from __future__ import annotations

import asyncio
import secrets
import subprocess

import pytest
from tornado import web

from hub_harness import runs_as_root
from pdl_spawner.accounts import unix_accounts
from pdl_spawner.accounts.lab_logins import PDLLDAPAuthenticator, PDLPAMAuthenticator
from pdl_spawner.accounts.unix_accounts import ForeignAccount, lab_account

pytestmark = pytest.mark.skipif(not runs_as_root(), reason="real accounts and PAM's password check need root")


@pytest.fixture(scope="module")
def lab():
    """Two accounts of the lab (``member`` in its group, ``outsider`` not), with passwords."""
    tag = secrets.token_hex(3)
    group, member, outsider = f"lab{tag}g", f"lab{tag}m", f"lab{tag}o"
    passwords = {member: secrets.token_urlsafe(12), outsider: secrets.token_urlsafe(12)}
    subprocess.run(["groupadd", group], check=True)
    try:
        for name in (member, outsider):
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        subprocess.run(["usermod", "--append", "--groups", group, member], check=True)
        subprocess.run(["chpasswd"], input="".join(f"{n}:{p}\n" for n, p in passwords.items()), text=True,
                       check=True)
        yield {"group": group, "member": member, "outsider": outsider, "passwords": passwords}
    finally:
        for name in (member, outsider):
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def login(auth, name: str, password: str):
    return asyncio.run(auth.authenticate(None, {"username": name, "password": password}))


def test_a_lab_account_logs_in_with_its_own_password_through_pam(lab):
    auth = PDLPAMAuthenticator()
    member = lab["member"]
    assert login(auth, member.upper(), lab["passwords"][member]) == member  # names are normalised
    assert login(auth, member, "not-" + lab["passwords"][member]) is None
    assert login(auth, member, lab["passwords"][lab["outsider"]]) is None  # another account's password


def test_wrong_passwords_lock_a_pam_name_and_its_right_password_waits(lab):
    auth = PDLPAMAuthenticator(allowed_failed_logins=2, seconds_before_next_try=60)
    member = lab["member"]
    assert login(auth, member, "guess-1") is None and login(auth, member, "guess-2") is None
    with pytest.raises(web.HTTPError) as locked:
        login(auth, member, lab["passwords"][member])
    assert locked.value.status_code == 403 and "Too many failed logins" in locked.value.log_message
    assert login(auth, lab["outsider"], lab["passwords"][lab["outsider"]]) == lab["outsider"]  # others go on


def test_guesses_sent_at_once_get_one_check_and_429(lab):
    """PAM answers a wrong password after its fail delay (seconds): guesses at once would
    otherwise each get a check before any was counted."""
    auth = PDLPAMAuthenticator()
    member = lab["member"]

    async def at_once():
        return await asyncio.gather(*(auth.authenticate(None, {"username": member, "password": f"guess-{i}"})
                                      for i in range(3)), return_exceptions=True)

    answers = asyncio.run(at_once())
    refused = [a for a in answers if isinstance(a, web.HTTPError)]
    assert answers.count(None) == 1 and len(refused) == 2 and all(e.status_code == 429 for e in refused)


def test_a_name_that_cannot_be_a_hub_users_never_reaches_pam(lab, monkeypatch):
    auth = PDLPAMAuthenticator()
    monkeypatch.setattr(auth, "check_password", lambda handler, data: pytest.fail(f"PAM asked for {data}"))
    assert login(auth, "../" + lab["member"], lab["passwords"][lab["member"]]) is None
    assert not auth.login_attempts  # refused as a wrong password is, and kept nowhere (issue 60, 1)


def test_a_lab_logins_fields_past_their_bounds_never_reach_pam_nor_stay_in_the_hub(lab, monkeypatch):
    """The attack (issue 60, 1): each failed login's name, of any length, stayed in the
    lockout's counts for an hour (1 MB names grew the hub by 131 MiB). A name past
    NAME_CHARS gets 400 in one line quoting none of it; a password past PASSWORD_CHARS
    is a wrong one, counted, that PAM never hears of (it checks a stand-in instead, so
    that the answer takes as long as any)."""
    from pdl_spawner.accounts import form_limits

    auth = PDLPAMAuthenticator()
    asked = []
    monkeypatch.setattr(auth, "check_password", lambda handler, data: asked.append(data["password"]))
    with pytest.raises(web.HTTPError) as refused:
        login(auth, "a" * (form_limits.NAME_CHARS + 1), "a-guess")
    assert refused.value.status_code == 400 and "at most 256 characters" in refused.value.log_message
    assert "aaaaaaaaaa" not in refused.value.log_message and not auth.login_attempts and not asked
    assert login(auth, lab["member"], "p" * (form_limits.PASSWORD_CHARS + 1)) is None
    assert auth.login_attempts[(lab["member"], False)]["count"] == 1
    assert len(asked) == 1 and len(asked[0]) < 64 and "ppp" not in asked[0]


def test_a_hub_user_runs_only_as_an_ordinary_lab_account_of_the_allowed_group(lab):
    member, outsider, group = lab["member"], lab["outsider"], lab["group"]
    assert lab_account(member, group=group).pw_name == member
    assert lab_account(outsider).pw_name == outsider  # no group asked for
    refusals = {
        "not in group": (outsider, {"group": group}),
        "no group": (member, {"group": group + "x"}),
        "root": ("root", {}),
        "system": ("daemon", {}),
        "below the minimum": (member, {"lowest_uid": 1 << 30}),
        "missing": (member + "x", {}),
    }
    for why, (name, rules) in refusals.items():
        with pytest.raises(ForeignAccount) as refused:
            lab_account(name, **rules)
        line = str(refused.value)
        assert "\n" not in line and (name in line or rules.get("group", "") in line), (why, line)
    assert unix_accounts.uid_min() > 1  # daemon (uid 1) is a system account on every machine


def test_a_directory_that_does_not_answer_is_a_one_line_503_not_a_hub_error():
    """Guards PDLLDAPAuthenticator.check_password: the lab's LDAP server down (here a port
    nobody listens on) is said on the login page; the next try checks again."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    auth = PDLLDAPAuthenticator(server_address="127.0.0.1", server_port=port, tls_strategy="insecure",
                                bind_dn_template=["uid={username},ou=people,dc=lab,dc=test"])
    for _ in range(2):
        with pytest.raises(web.HTTPError) as refused:
            login(auth, "ann", "her-password")
        assert refused.value.status_code == 503, refused.value
        line = refused.value.log_message
        assert line == f"The lab's directory (LDAP at 127.0.0.1:{port}) does not answer: try again later.", line
