"""Each hub user's own login (pdl_spawner/accounts/authenticator.py), through a real JupyterHub's login
and sign-up forms: the admin's printed password, sign-up with one's own password, no
shared password, bcrypt hashes, lockout, the admin's approval, valid names. The last
tests build the authenticator alone (no hub) for what a root-run hub cannot show."""

from __future__ import annotations

import html
import os
import re
import sqlite3
import stat
import statistics
import time

import bcrypt
import pytest
import requests

from hub_harness import hub_fixture, page_alert, runs_as_root
from pdl_spawner.accounts.credentials import ADMIN_PASSWORD_BYTES, secret_file

#: The harness signs ann, ben, cal and dee up. A test that locks a name out uses one
#: no other test locks, so that no test waits for what another left of a lock.
SIGNED_UP = ["admin", "ann", "ben", "cal", "dee"]
#: kate signs up in a test, with her one-time code; lou never does (a listed name whose
#: code waits)
USERS = [*SIGNED_UP, "kate", "lou"]
ATTEMPTS, LOCKOUT_S = 3, 5  # the hub's PDL_LOGIN_ATTEMPTS and PDL_LOGIN_LOCKOUT_S
PENDING = 2  # the hub's PDL_PENDING_SIGNUPS
#: The hub's PDL_SIGNUPS_PER_ADDRESS: every sign-up here comes from 127.0.0.1, and one
#: without a code counts, whatever its name (the limit itself: a unit test below)
SIGNUPS_PER_ADDRESS = 100
LOGIN_COOKIE = "jupyterhub-hub-login"
NAME_RULE = "is not a valid name: use a lowercase letter followed by at most 19 lowercase letters"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub where the harness signed ann and ben up through /hub/signup, each with a
    random password of their own (``hub.password(user)``)."""
    if not runs_as_root():
        pytest.skip("signup is open only when the hub runs as root (without root, one user logs in)")
    yield from hub_fixture(tmp_path_factory.mktemp("hub-accounts"), USERS, ["cpu:0"],
                           hub_env={"PDL_LOGIN_ATTEMPTS": str(ATTEMPTS), "PDL_LOGIN_LOCKOUT_S": str(LOCKOUT_S),
                                    "PDL_PENDING_SIGNUPS": str(PENDING),
                                    "PDL_SIGNUPS_PER_ADDRESS": str(SIGNUPS_PER_ADDRESS)},
                           signs_up_later=("kate", "lou"))


def stored_passwords(hub) -> dict[str, bytes]:
    """name -> password column of users_info (NativeAuthenticator's table in the hub's database)."""
    db = sqlite3.connect(f"file:{hub.state_dir / 'jupyterhub.sqlite'}?mode=ro", uri=True)
    try:
        return dict(db.execute("select username, password from users_info"))
    finally:
        db.close()


def logged_in(session) -> bool:
    return bool(session.cookies.get(LOGIN_COOKIE))


def from_the_authorize_page(hub) -> dict[str, str]:
    """The headers of a browser's click on a link of /hub/authorize."""
    return {"Referer": f"{hub.url}/hub/authorize", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"}


@pytest.mark.hub
def test_the_admin_logs_in_with_the_password_scripts_serve_prints(hub):
    """Guards README "The embedded default": the admin's password is random, printed by
    scripts/serve, and kept with mode 0600 in the hub's own state folder."""
    printed = secret_file(hub.state_dir, "password", ADMIN_PASSWORD_BYTES)  # scripts/serve's line
    assert stat.S_IMODE(os.stat(hub.state_dir / "password").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(hub.state_dir).st_mode) == 0o700
    admin = hub.login("admin", printed)
    assert logged_in(admin)
    assert admin.get(f"{hub.url}/hub/admin").status_code == 200
    assert not logged_in(hub.login("admin", printed[:-1]))


@pytest.mark.hub
def test_a_listed_user_signs_up_with_her_own_password_and_logs_in_at_once(hub):
    """Guards README "To add a user": listed names sign up at /hub/signup with a password
    of their own and can log in at once; nobody can take an existing name over (the
    sign-up is answered as a new name's, and changes nothing)."""
    ann, refused = hub.try_login("ann", hub.password("ann"))  # the harness signed her up through the form
    assert refused == "" and logged_in(ann)
    assert "ann" in ann.get(f"{hub.url}/hub/home").text
    assert hub.signup("ann", "a-takeover-password") == "Signed up: you can log in once an admin approves ann."
    assert not logged_in(hub.login("ann", "a-takeover-password"))
    assert logged_in(hub.login("ann"))  # clears her failure count for the tests below


@pytest.mark.hub
def test_ben_cannot_log_in_as_ann_with_his_password_nor_a_shared_one(hub):
    """Guards docs/reliability.md "Log in as another user, with their name and one's own
    password": refused; each user has their own password and none is shared."""
    assert not (hub.state_dir / "user-password").exists()  # the old scheme's shared password
    assert hub.password("ben") != hub.password("ann")
    for password in (hub.password("ben"), hub.password("admin")):
        session, refused = hub.try_login("ann", password)
        assert not logged_in(session) and refused == "Invalid username or password"
    assert logged_in(hub.login("ann"))  # her own does (and clears her failure count)


@pytest.mark.hub
def test_passwords_are_stored_as_bcrypt_hashes_only(hub):
    """Guards README "stored as a bcrypt hash": the hub's database holds no password in clear."""
    stored = stored_passwords(hub)
    assert set(SIGNED_UP) <= set(stored)
    for user in SIGNED_UP:
        assert stored[user].startswith(b"$2b$12$"), stored[user][:7]  # bcrypt, cost 12
        assert bcrypt.checkpw(hub.password(user).encode(), stored[user])
    assert not bcrypt.checkpw(hub.password("ben").encode(), stored["ann"])
    database = (hub.state_dir / "jupyterhub.sqlite").read_bytes()
    for user in SIGNED_UP:
        assert hub.password(user).encode() not in database


@pytest.mark.hub
@pytest.mark.timing
def test_repeated_failures_lock_a_name_even_for_the_right_password_until_the_lockout_passes(hub):
    """Guards docs/admin.md "Five wrong passwords in a row lock a name for a minute"
    (PDL_LOGIN_ATTEMPTS, PDL_LOGIN_LOCKOUT_S; here 3 and 5 s)."""
    for _ in range(ATTEMPTS):
        assert hub.try_login("ben", "not-bens-password")[1] == "Invalid username or password"
    locked_at = time.monotonic()  # the hub counted the last failure before it answered
    session, refused = hub.try_login("ben")
    assert not logged_in(session)
    assert refused.startswith("Too many failed logins for ben: try again in"), refused
    assert logged_in(hub.login("ann"))  # one name's lock is not another's

    time.sleep(max(0.0, locked_at + LOCKOUT_S / 2 - time.monotonic()))
    assert "Too many failed logins" in hub.try_login("ben")[1]  # still locked halfway
    time.sleep(max(0.0, locked_at + LOCKOUT_S + 0.3 - time.monotonic()))
    session, refused = hub.try_login("ben")
    assert refused == "" and logged_in(session)


@pytest.mark.hub
@pytest.mark.timing
def test_forty_guesses_at_once_get_no_more_checks_than_the_lockout_allows(hub):
    """The attack: 40 simultaneous wrong passwords for a name (cal) were all checked (the count
    came after each check), so none was refused as locked. Now each is counted before
    its check and cal has one check at a time: at most ATTEMPTS are checked, the rest
    are refused (being checked, or locked)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda i: hub.try_login("cal", f"guess-{i}")[1], range(40)))
    checked = [a for a in answers if a == "Invalid username or password"]
    refused = [a for a in answers if a.startswith(("A login for cal is being checked: try again in a moment.",
                                                    "Too many failed logins for cal"))]
    assert 1 <= len(checked) <= ATTEMPTS and len(checked) + len(refused) == 40, answers
    time.sleep(LOCKOUT_S + 0.3)
    session, refused_now = hub.try_login("cal")
    assert refused_now == "" and logged_in(session)  # the owner gets in once the lock has passed


@pytest.mark.hub
@pytest.mark.timing
def test_a_missing_name_and_a_wrong_password_cannot_be_told_apart(hub):
    """The attack (issue 45, 4): a wrong password for a missing name answered in 53 ms,
    for an existing one in 719 ms (the password check), and only existing names were
    ever locked. Now both get the same answer after as long, and the same lock."""

    def timed_login(name: str) -> tuple[float, str]:
        started = time.monotonic()
        refused = hub.try_login(name, "not-the-password")[1]
        return time.monotonic() - started, refused

    seconds: dict[str, list[float]] = {"dee": [], "nobody-here": []}
    for _ in range(ATTEMPTS):
        for name in seconds:  # taken in turns: a slower moment of the machine hits both
            took, refused = timed_login(name)
            assert refused == "Invalid username or password", (name, refused)
            seconds[name].append(took)
    for name in seconds:  # dee's own password, and a guess for the missing name: both locked
        password = hub.password(name) if name == "dee" else "a-good-guess"
        assert hub.try_login(name, password)[1].startswith(f"Too many failed logins for {name}: try again in"), name
    existing, missing = (statistics.median(seconds[name]) for name in seconds)
    assert 1 / 1.3 <= existing / missing <= 1.3, seconds


@pytest.mark.hub
def test_a_stranger_cannot_keep_ann_out_of_the_browser_she_logged_in_from(hub):
    """The attack (issue 27, 9): a stranger who sent one wrong guess each time the lock
    ended kept ann locked out for good. Now a browser that logged in as ann keeps its own
    count: the stranger's guesses lock ann's name for every other browser only."""
    time.sleep(LOCKOUT_S + 0.3)  # whatever an earlier test left of a lock
    ann_browser = hub.login("ann")
    assert logged_in(ann_browser)
    assert ann_browser.cookies.get("pdl-known-ann")  # signed by the hub, below
    for round_ in range(3):  # ATTEMPTS guesses lock the name; then one each time the lock ends
        for _ in range(ATTEMPTS if round_ == 0 else 1):
            assert hub.try_login("ann", "a-strangers-guess")[1] == "Invalid username or password"
        assert hub.try_login("ann")[1].startswith("Too many failed logins for ann"), round_  # a new browser
        session, refused = hub.try_login("ann", browser=ann_browser)
        assert refused == "" and logged_in(session), (round_, refused)
        time.sleep(LOCKOUT_S + 0.3)
    # the cookie says which name it knows, and only the hub can sign one
    forged = requests.Session()
    forged.cookies.set("pdl-known-ann", "ann")
    assert hub.try_login("ann", "a-strangers-guess")[1] == "Invalid username or password"
    assert hub.try_login("ann", browser=forged)[1].startswith("Too many failed logins for ann")
    ben_browser = hub.login("ben")
    assert hub.try_login("ann", browser=ben_browser)[1].startswith("Too many failed logins for ann")
    time.sleep(LOCKOUT_S + 0.3)
    assert logged_in(hub.login("ann"))  # clears the count for the tests below


@pytest.mark.unit
def test_a_strangers_check_in_flight_does_not_turn_the_owners_browser_away(authenticator_db, tmp_path,
                                                                            monkeypatch):
    """One check at a time is per name and browser kind: while a stranger's guess for
    admin is checked, the admin's own browser (the signed cookie) is checked, not 429."""
    import asyncio
    import threading
    from types import SimpleNamespace

    import pdl_spawner.accounts.authenticator as accounts

    auth = make_authenticator(authenticator_db, tmp_path)
    checks, release = [], threading.Event()

    def slow_check(hashed, password):
        checks.append(password)
        if password == "strangers-guess":
            release.wait(10)
        return False

    monkeypatch.setattr(accounts, "password_matches", slow_check)
    owners_browser = SimpleNamespace(get_signed_cookie=lambda name, max_age_days: b"admin"
                                     if name == "pdl-known-admin" else None)

    async def both():
        stranger = asyncio.create_task(auth.authenticate(None, {"username": "admin", "password": "strangers-guess"}))
        while not checks:
            await asyncio.sleep(0.01)
        owner = await auth.authenticate(owners_browser, {"username": "admin", "password": "owners-typo"})
        release.set()
        return owner, await stranger

    assert asyncio.run(both()) == (None, None)
    assert checks == ["strangers-guess", "owners-typo"]
    assert auth.login_attempts[("admin", True)]["count"] == 1 and auth.login_attempts[("admin", False)]["count"] == 1


@pytest.mark.hub
def test_a_listed_name_is_claimed_only_with_its_one_time_code(hub):
    """The attack (issue 27, 8): anyone could sign up first as a name in PDL_USERS and was
    approved at once with their own password. Guards ``SignUpHandler.post``
    (``has_signup_code``, ``sign_up``) and ``credentials.SignupCodes``: without kate's
    code, or with another's or a made-up one, the sign-up makes no account (and is
    answered as an unlisted name's: it does not tell that kate is listed); with hers
    (the link scripts/serve prints) she is approved at once, once."""
    codes = hub.signup_codes()
    assert set(codes) == {"kate", "lou"}  # ann's and ben's were used when the harness signed them up
    refusal = "Signed up: you can log in once an admin approves kate."
    for code in ("", "made-up-code", codes["kate"][:-1], codes["lou"]):
        assert hub.signup("kate", "a-strangers-passphrase", code=code) == refusal
    assert hub.signup("\u212Aate", "a-strangers-passphrase", code="") != "Signed up and approved: you can log in now."
    assert "kate" not in stored_passwords(hub)
    assert os.stat(hub.state_dir / "signup-codes").st_mode & 0o077 == 0

    assert hub.signup("kate", "kates-own-passphrase", code=codes["kate"]) == "Signed up and approved: you can log in now."
    assert logged_in(hub.login("kate", "kates-own-passphrase"))
    assert set(hub.signup_codes()) == {"lou"}
    assert hub.signup("kate", "a-strangers-passphrase", code=codes["kate"]) == refusal
    assert logged_in(hub.login("kate", "kates-own-passphrase"))  # her password is still hers


@pytest.mark.hub
def test_an_unlisted_name_that_signs_up_waits_for_the_admins_approval(hub):
    """Guards README "Others who sign up wait for the admin's approval at /hub/authorize",
    and that only the admin, from the hub's own page, can approve."""
    answer = hub.signup("zoe", "zoes-own-passphrase")
    assert answer == "Signed up: you can log in once an admin approves zoe.", answer
    session, refused = hub.try_login("zoe", "zoes-own-passphrase")
    assert not logged_in(session) and refused == "zoe is waiting for an admin's approval."

    admin, ann = hub.login("admin"), hub.login("ann")
    assert "zoe" in admin.get(f"{hub.url}/hub/authorize").text
    assert ann.get(f"{hub.url}/hub/authorize/zoe", headers=from_the_authorize_page(hub)).status_code == 403
    forged = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}  # a link on another site
    assert admin.get(f"{hub.url}/hub/authorize/zoe", headers=forged).status_code == 403
    assert not logged_in(hub.login("zoe", "zoes-own-passphrase"))

    approved = admin.get(f"{hub.url}/hub/authorize/zoe", headers=from_the_authorize_page(hub))
    assert approved.status_code == 200 and approved.url.endswith("/hub/authorize#zoe")
    zoe = hub.login("zoe", "zoes-own-passphrase")
    assert logged_in(zoe) and "zoe" in zoe.get(f"{hub.url}/hub/home").text


@pytest.mark.hub
@pytest.mark.parametrize("name", ["Ann!", "../x", "a" * 40, "9lives", "ann smith", "émile", "\u212Aate", "\uff41nn"])
def test_names_that_cannot_be_unix_accounts_are_refused_with_what_is_valid(hub, name):
    """Guards docs/admin.md "Names are a lowercase letter then up to 19 lowercase letters,
    digits, _ or -: each becomes a Unix account", and the attack of issue 27 (8): a
    look-alike (``\u212Aate`` with a Kelvin sign, ``\uff41nn`` with a fullwidth a) became
    the name it resembles (kate; ann, taken) at sign-up."""
    before = stored_passwords(hub)
    answer = hub.signup(name, "a-fine-passphrase")
    assert NAME_RULE in answer and "\n" not in answer, answer
    assert stored_passwords(hub) == before  # no account made, none changed
    if name.isascii():  # a look-alike logs in as the name it resembles: ann's count must stay clear
        assert not logged_in(hub.login(name, "a-fine-passphrase"))


@pytest.mark.hub
@pytest.mark.parametrize("password, reason", [
    ("short", "The password must have at least 8 characters."),
    ("password123", "This password is too common: choose another one."),
    ("x" * 73, "The password must have at most 72 bytes."),
])
def test_weak_or_over_long_passwords_are_refused_with_the_reason(hub, password, reason):
    """Guards docs/admin.md "a password of their own" (at least 8 characters, not a common
    one; bcrypt takes at most 72 bytes, so a longer one is refused, not cut)."""
    assert hub.signup("cleo", password) == reason
    assert "cleo" not in stored_passwords(hub)


@pytest.mark.hub
def test_an_over_long_password_at_login_is_refused_like_any_wrong_one(hub):
    """Guards the accounts.py contract (JupyterHub 6 fixes): bcrypt 5 raises on passwords
    of over 72 bytes; the login form answers as for any wrong password, not with HTTP 500."""
    session, refused = hub.try_login("ben", "x" * 73)
    assert refused == "Invalid username or password" and not logged_in(session)
    assert logged_in(hub.login("ben"))  # and clears his failure count


@pytest.mark.hub
def test_strangers_cannot_pile_up_sign_ups_beyond_the_cap(hub):
    """The attack (issue 27, 4): 32 anonymous sign-ups, each hashing a password on the
    hub, stalled it for seconds, and pending sign-ups were unlimited. Now at most
    PDL_PENDING_SIGNUPS wait for the admin; beyond, 429 in one line before any hashing,
    and room comes back when the admin answers one."""
    names = [f"pend-{i}" for i in range(PENDING + 1)]
    for name in names[:PENDING]:
        assert hub.signup(name, f"{name}-own-passphrase") == f"Signed up: you can log in once an admin approves {name}."
    browser = requests.Session()
    browser.get(f"{hub.url}/hub/signup", timeout=10).raise_for_status()
    over = browser.post(f"{hub.url}/hub/signup", timeout=30, data={
        "_xsrf": browser.cookies.get("_xsrf", ""), "username": names[-1],
        "signup_password": "a-strangers-passphrase", "signup_password_confirmation": "a-strangers-passphrase"})
    assert over.status_code == 429, over.status_code
    assert f"{PENDING} sign-ups already wait for the admin's approval" in html.unescape(over.text)
    assert names[-1] not in stored_passwords(hub)

    admin = hub.login("admin")
    discarded = admin.get(f"{hub.url}/hub/discard/{names[0]}", headers=from_the_authorize_page(hub))
    assert discarded.status_code == 200 and names[0] not in stored_passwords(hub)
    assert hub.signup(names[-1], "a-strangers-passphrase").startswith("Signed up: you can log in once")
    for name in names[1:]:  # leave no pending sign-up to the tests below
        admin.get(f"{hub.url}/hub/discard/{name}", headers=from_the_authorize_page(hub))
    assert not set(names) & set(stored_passwords(hub))


#: What a sign-up for a new name that waits for approval answers, the name aside.
WAITS = "Signed up: you can log in once an admin approves {}."


def signup_page(hub, name: str, password: str, browser: requests.Session | None = None) -> tuple[int, str]:
    """A sign-up's status and page, the name and the form's token masked: all that could
    tell one sign-up from another."""
    r = hub.signup_response(name, password, browser=browser)
    page = re.sub(r'(name="_xsrf"[^>]*value=")[^"]*"', r"\1", r.text)
    page = re.sub(r"(xsrf_token:\s*)\"[^\"]*\"", r"\1", page)
    return r.status_code, re.sub(rf"\b{re.escape(name)}\b", "NAME", page)


def discard(hub, *names: str) -> None:
    """The admin discards the sign-ups of ``names`` (waiting for approval) at /hub/authorize."""
    admin = hub.login("admin")
    for name in names:
        r = admin.get(f"{hub.url}/hub/discard/{name}", headers=from_the_authorize_page(hub))
        assert r.status_code == 200, (name, r.status_code)


@pytest.mark.hub
def test_a_sign_up_answers_the_same_for_a_taken_a_waiting_a_listed_and_a_free_name(hub):
    """The attack (issue 60, 2): the sign-up page said "this username is already in use"
    for a name with an account and complained about the password's confirmation for a
    free one, so it told which names exist. Now an approved name, one that waits for
    approval, a listed one without its code and a free one get the same status and
    page, their names aside; only the free one makes an account."""
    before = stored_passwords(hub)
    assert hub.signup("wait-a", "wait-as-passphrase") == WAITS.format("wait-a")
    answers = {name: signup_page(hub, name, "a-strangers-passphrase") for name in ("ann", "wait-a", "lou", "free-a")}
    try:
        assert page_alert(answers["free-a"][1]) == WAITS.format("NAME"), answers["free-a"]
        for name, answer in answers.items():
            assert answer == answers["free-a"], name
        # the sign-up checks that need no account come first, and answer alike too
        for password, confirmation in (("short", None), ("a-fine-passphrase", "another-passphrase")):
            refusals = {name: page_alert(hub.signup_response(name, password, confirmation).text)
                        for name in ("ann", "lou", "free-b")}
            assert len(set(refusals.values())) == 1 and "Signed up" not in refusals["ann"], refusals
        stored = stored_passwords(hub)
        assert stored["ann"] == before["ann"] and "lou" not in stored and {"wait-a", "free-a"} <= set(stored)
        assert not logged_in(hub.login("ann", "a-strangers-passphrase"))
    finally:
        discard(hub, "wait-a", "free-a")


@pytest.mark.hub
@pytest.mark.timing
def test_a_sign_up_takes_as_long_for_a_taken_a_waiting_a_listed_and_a_free_name(hub):
    """The attack (issue 60, 2), by the clock: a free name's sign-up hashes its password
    (bcrypt, about 0.2 s) and a taken one did not. Now each hashes it, in the same pool:
    the medians agree within the ratio the login's timing test takes."""
    assert hub.signup("wait-t", "wait-ts-passphrase") == WAITS.format("wait-t")
    seconds: dict[str, list[float]] = {"ann": [], "wait-t": [], "lou": [], "free": []}
    answers = set()
    try:
        for round_ in range(3):
            for kind in seconds:  # taken in turns: a slower moment of the machine hits all
                name = f"free-t{round_}" if kind == "free" else kind
                browser = requests.Session()
                browser.get(f"{hub.url}/hub/signup", timeout=10).raise_for_status()
                started = time.monotonic()
                status, page = signup_page(hub, name, "a-strangers-passphrase", browser=browser)
                seconds[kind].append(time.monotonic() - started)
                answers.add((status, page_alert(page)))
            discard(hub, f"free-t{round_}")
    finally:
        discard(hub, "wait-t")
    free = statistics.median(seconds["free"])
    for kind in ("ann", "wait-t", "lou"):
        assert 1 / 1.3 <= statistics.median(seconds[kind]) / free <= 1.3, seconds
    assert answers == {(200, WAITS.format("NAME"))}, answers


@pytest.mark.hub
def test_anonymous_logins_and_sign_ups_with_huge_fields_cannot_grow_the_hubs_memory(hub):
    """The attack (issue 60, 1): 120 failed logins with 1 MB names raised the hub's
    resident memory from 137 to 268 MiB, still 268 MiB a minute later (the lockout kept
    each name for an hour). Now every field is bounded before anything keeps, logs or
    hashes it: logins and sign-ups with 512 KiB fields get 400 in one line, and logins
    for distinct names of the longest lengths keep at most NAMES_KEPT small counts.
    The hub's resident memory after them stays within 16 MiB of what it was after a
    warm-up (it grew by about 1 MiB a login before; by under 1 MiB in all now)."""
    import concurrent.futures
    import threading

    from pdl_spawner.accounts import form_limits

    huge = 512 * 1024
    login, signup = requests.Session(), requests.Session()
    login.get(f"{hub.url}/hub/login", timeout=10).raise_for_status()
    signup.get(f"{hub.url}/hub/signup", timeout=10).raise_for_status()

    def huge_login(i: int) -> tuple[int, bool, str]:
        r = login.post(f"{hub.url}/hub/login", timeout=30, allow_redirects=False, data={
            "_xsrf": login.cookies.get("_xsrf", ""), "username": f"{i:06d}".ljust(huge, "n"),
            "password": "x" * (huge // 2)})  # both within PDL_MAX_REQUEST_BYTES (1 MiB)
        return r.status_code, len(r.text) < 64 * 1024, page_alert(r.text).replace(f"{i:06d}", "")

    fields = ("username", "signup_password", "signup_password_confirmation", "email", "2fa")

    def huge_signup(i: int) -> tuple[int, bool, str]:
        form = {"username": f"big-{i}", "signup_password": "a-fine-passphrase",
                "signup_password_confirmation": "a-fine-passphrase"}
        form[fields[i % len(fields)]] = f"{i:06d}".ljust(huge, "s")
        r = signup.post(f"{hub.url}/hub/signup", timeout=30, data={"_xsrf": signup.cookies.get("_xsrf", ""), **form})
        return r.status_code, len(r.text) < 64 * 1024, page_alert(r.text)[:80]

    browsers = threading.local()

    def distinct_login(i: int) -> str:
        if not hasattr(browsers, "session"):
            browsers.session = requests.Session()
            browsers.session.get(f"{hub.url}/hub/login", timeout=10).raise_for_status()
        # the longest of each: a name that can be a hub user's (20), and any (NAME_CHARS)
        name = f"m{i:019d}" if i % 2 else f"{i:06d}".ljust(form_limits.NAME_CHARS, "N")
        r = browsers.session.post(f"{hub.url}/hub/login", timeout=60, allow_redirects=False, data={
            "_xsrf": browsers.session.cookies.get("_xsrf", ""), "username": name,
            "password": "p" * form_limits.PASSWORD_CHARS})
        return page_alert(r.text)

    def load(first: int, count: int, names: int) -> tuple[set, set, set]:
        logins = {huge_login(i) for i in range(first, first + count)}
        signups = {huge_signup(i) for i in range(first, first + count)}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return logins, signups, set(pool.map(distinct_login, range(first, first + names)))

    load(0, 20, 8)  # the warm-up: the hub's pools and caches at their working size
    warm = hub.rss_kib()
    logins, signups, distinct = load(1000, 300, 40)  # each name a bcrypt check
    grown_mib = (hub.rss_kib() - warm) / 1024
    assert grown_mib < 16, f"the hub's resident memory grew by {grown_mib:.0f} MiB"
    assert logins == {(400, True, "The user name may have at most 256 characters; this one has 524288.")}, logins
    assert {(status, short) for status, short, _ in signups} == {(400, True)}, signups
    assert all("may have at most" in alert for _, _, alert in signups), signups
    assert distinct == {"Invalid username or password"}, distinct


@pytest.mark.hub
def test_the_hub_reads_at_most_32_kib_of_headers_and_logs_at_most_2000_characters_of_a_line(hub):
    """The attack (issue 60, 1): every request line and header the hub process reads, and
    every log line that quotes one, was bounded by tornado's 64 KiB at most. Now a
    request whose headers pass MAX_HEADER_BYTES is closed unanswered (a browser's
    cookies, 12 KiB here, still pass, through the proxy and at the hub's own port), and
    a log line quotes at most LOGGED_CHARS characters of a long URI."""
    from pdl_spawner.hub.log_lines import LOGGED_CHARS
    from pdl_spawner.hub.request_limits import MAX_HEADER_BYTES

    own = f"http://127.0.0.1:{hub.internal_port}/hub/login"
    cookies = {"Cookie": "pdl-test=" + "c" * 12 * 1024}
    assert requests.get(own, headers=cookies, timeout=10).status_code == 200
    assert requests.get(f"{hub.url}/hub/login", headers=cookies, timeout=10).status_code == 200
    with pytest.raises(requests.ConnectionError):
        requests.get(own, headers={"X-Padding": "p" * (MAX_HEADER_BYTES + 1024)}, timeout=10)
    assert requests.get(own, timeout=10).status_code == 200  # and the hub answers the next one

    marker = f"long-uri-{time.monotonic_ns()}"
    r = requests.get(f"{hub.url}/hub/login", params={"next": "/hub/", marker: "u" * 12_000}, timeout=10)
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while not (logged := [line for line in hub.log_path.read_text(errors="replace").splitlines() if marker in line]):
        assert time.monotonic() < deadline, "the request was not logged"
        time.sleep(0.1)
    assert all(len(line) <= LOGGED_CHARS + 200 for line in logged), [len(line) for line in logged]
    assert logged[0].endswith(" characters)"), logged[0][-80:]


# -- the authenticator alone ---------------------------------------------------------


@pytest.fixture
def authenticator_db(tmp_path):
    """A fresh hub database session, as JupyterHub hands its authenticator one."""
    from jupyterhub import orm

    return orm.new_session_factory(f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}")()


def make_authenticator(db, tmp_path, **config):
    from pdl_spawner.accounts.authenticator import PDLAuthenticator

    return PDLAuthenticator(_deprecated_db_session=db, first_admin="admin",
                            first_admin_password_file=str(tmp_path / "state" / "password"), **config)


@pytest.mark.unit
def test_a_name_has_one_password_check_at_a_time_counted_before_it_runs(authenticator_db, tmp_path,
                                                                         monkeypatch):
    """Guards authenticate's order: the attempt is counted, then checked, one at a time
    per name; guesses that arrive meanwhile get 429 without a check."""
    import asyncio
    import threading

    from tornado import web

    import pdl_spawner.accounts.authenticator as accounts

    auth = make_authenticator(authenticator_db, tmp_path)
    checks, release = [], threading.Event()

    def slow_check(hashed, password):
        checks.append(password)
        release.wait(10)
        return False

    monkeypatch.setattr(accounts, "password_matches", slow_check)

    async def guesses():
        first = asyncio.create_task(auth.authenticate(None, {"username": "admin", "password": "guess-0"}))
        while not checks:
            await asyncio.sleep(0.01)
        assert auth.login_attempts[("admin", False)]["count"] == 1  # counted before the check ended
        others = await asyncio.gather(*(auth.authenticate(None, {"username": "admin", "password": f"guess-{i}"})
                                        for i in range(1, 10)), return_exceptions=True)
        release.set()
        return await first, others

    first, others = asyncio.run(guesses())
    assert first is None and checks == ["guess-0"]
    assert all(isinstance(e, web.HTTPError) and e.status_code == 429 for e in others), others
    assert auth.login_attempts[("admin", False)]["count"] == 1


@pytest.mark.unit
def test_a_flood_of_logins_gets_429_beyond_the_cap_and_never_the_hubs_default_threads(authenticator_db,
                                                                                        tmp_path, monkeypatch):
    """80 wrong logins at once used to take the hub's default thread pool (address
    lookups, account preparation): another user's spawn took 45 s instead of 12. Checks
    run in a pool of their own, and beyond LOGIN_CHECKS_AT_MOST a login gets 429."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from tornado import web

    import pdl_spawner.accounts.authenticator as accounts
    import pdl_spawner.accounts.login_guard as guard

    auth = make_authenticator(authenticator_db, tmp_path)
    monkeypatch.setattr(auth, "get_user", lambda name: SimpleNamespace(password=b"", has_2fa=False,
                                                                      is_authorized=True))
    threads, release = set(), threading.Event()

    def slow_check(hashed, password):
        threads.add(threading.current_thread().name)
        release.wait(10)
        return False

    monkeypatch.setattr(accounts, "password_matches", slow_check)
    flood = guard.LOGIN_CHECKS_AT_MOST + 8

    async def logins():
        tasks = [asyncio.create_task(auth.authenticate(None, {"username": f"user{i}", "password": "guess"}))
                 for i in range(flood)]
        await asyncio.sleep(0.2)
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    answers = asyncio.run(logins())
    refused = [a for a in answers if isinstance(a, web.HTTPError)]
    assert answers.count(None) == guard.LOGIN_CHECKS_AT_MOST and len(refused) == 8
    assert all(e.status_code == 429 and "checking many logins" in e.log_message for e in refused)
    assert threads and all(name.startswith("pdl-login-check") for name in threads), threads
    assert len(threads) <= guard.LOGIN_CHECK_THREADS


@pytest.mark.unit
def test_signup_is_off_unless_the_hub_runs_as_root(authenticator_db, tmp_path, monkeypatch):
    """Guards docs/admin.md "Without root, the hub serves one person": every server would
    run as the hub's own Unix user, so nobody else may get an account."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    laptop = make_authenticator(authenticator_db, tmp_path, allowed_users={"ann"})
    assert laptop.enable_signup is False
    assert laptop.create_user("ann", "anns-own-passphrase") is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert make_authenticator(authenticator_db, tmp_path, allowed_users={"ann"}).enable_signup is True


@pytest.mark.unit
def test_the_admins_account_is_made_once_and_never_overwritten(authenticator_db, tmp_path):
    """Guards the accounts.py contract "An existing account is never touched": a restart
    does not reset a password the admin changed."""
    first = make_authenticator(authenticator_db, tmp_path)
    printed = (tmp_path / "state" / "password").read_text().strip()
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "password").st_mode) == 0o600
    assert first.get_user("admin").is_authorized and first.get_user("admin").is_valid_password(printed)
    assert first.change_password("admin", "the-admins-new-passphrase")
    restarted = make_authenticator(authenticator_db, tmp_path)
    assert restarted.get_user("admin").is_valid_password("the-admins-new-passphrase")
    assert not restarted.get_user("admin").is_valid_password(printed)


@pytest.mark.unit
def test_the_sign_up_cap_counts_pending_names_and_only_a_one_time_code_passes_it(authenticator_db, tmp_path):
    """Strangers who fill the waiting list must not keep the admin's listed users out:
    a listed name's sign-up with its own code is never held (SignUpHandler.post asks
    ``has_signup_code`` first); without it, a listed name is held as any other, so that
    the cap does not tell which names are listed."""
    from nativeauthenticator.orm import UserInfo

    from pdl_spawner.accounts.credentials import SignupCodes

    auth = make_authenticator(authenticator_db, tmp_path, allowed_users={"kate"}, pending_signups_at_most=2)
    code = SignupCodes(tmp_path / "state").ensure(["kate"])["kate"]
    authenticator_db.add(UserInfo(username="zed", password=b"x", is_authorized=False))
    authenticator_db.commit()
    assert auth.pending_signups_full() is None  # 1 waits (the admin is approved)
    authenticator_db.add(UserInfo(username="yan", password=b"x", is_authorized=False))
    authenticator_db.commit()
    assert auth.pending_signups_full().startswith("2 sign-ups already wait for the admin's approval")
    assert auth.has_signup_code("kate", code) and auth.has_signup_code("KATE", code)
    assert not auth.has_signup_code("kate", "") and not auth.has_signup_code("kate", code[:-1])
    assert not auth.has_signup_code("\u212Aate", code) and not auth.has_signup_code("mallory", code)


@pytest.mark.unit
def test_sign_ups_are_limited_per_client_address_whatever_headers_the_client_sends(authenticator_db, tmp_path,
                                                                                   monkeypatch):
    """The attack (issue 27, 4): anonymous sign-ups without limit. One address makes at
    most ``signups_per_address`` sign-ups without a one-time code in the window, counted
    at the address the proxy saw (the last ``X-Forwarded-For`` entry: a client's own
    ``X-Real-Ip`` or ``X-Forwarded-For`` entries do not move it); the name plays no part."""
    from types import SimpleNamespace

    from tornado.httputil import HTTPHeaders, HTTPServerRequest

    import pdl_spawner.accounts.pages as account_pages
    import pdl_spawner.accounts.authenticator as accounts

    now = [1000.0]
    monkeypatch.setattr(accounts, "time", SimpleNamespace(monotonic=lambda: now[0]))
    auth = make_authenticator(authenticator_db, tmp_path, allowed_users={"kate"}, signups_per_address=2,
                              signup_window_seconds=600)
    for _ in range(2):
        assert auth.signup_rate_full("203.0.113.9") is None
        auth.count_signup("203.0.113.9")
    assert auth.signup_rate_full("203.0.113.9") == (
        "2 sign-ups from your address in the last 10 minutes, the most this hub takes: try again in 600 s.")
    assert auth.signup_rate_full("198.51.100.7") is None  # another address
    now[0] += 601
    assert auth.signup_rate_full("203.0.113.9") is None  # the window has passed

    spoofed = HTTPServerRequest(method="POST", uri="/hub/signup", headers=HTTPHeaders(
        {"X-Forwarded-For": "10.9.9.9, 203.0.113.9", "X-Real-Ip": "10.8.8.8"}))
    spoofed.remote_ip = "10.8.8.8"  # what tornado's xheaders make of a client's own X-Real-Ip
    assert account_pages.client_address(spoofed) == "203.0.113.9"
    direct = HTTPServerRequest(method="POST", uri="/hub/signup", headers=HTTPHeaders())
    direct.remote_ip = "127.0.0.1"
    assert account_pages.client_address(direct) == "127.0.0.1"


@pytest.mark.unit
def test_behind_the_labs_reverse_proxy_a_client_is_counted_at_the_address_that_proxy_saw():
    """Behind a proxy that terminates TLS (``PDL_TLS_PROXY``), every client reaches the
    hub from the proxy's address: counted there, one visitor's sign-ups would use up
    everyone's. The proxy's own entry is skipped, and only it: what the client wrote
    before it still does not count."""
    from tornado.httputil import HTTPHeaders, HTTPServerRequest

    import pdl_spawner.accounts.pages as account_pages

    through_proxy = HTTPServerRequest(method="POST", uri="/hub/signup", headers=HTTPHeaders(
        {"X-Forwarded-For": "10.9.9.9, 203.0.113.9, 127.0.0.1"}))  # the client's, the proxy's, the hub proxy's
    assert account_pages.client_address(through_proxy, trusted=("127.0.0.1",)) == "203.0.113.9"
    assert account_pages.client_address(through_proxy) == "127.0.0.1"  # no proxy named: the last hop
    forged = HTTPServerRequest(method="POST", uri="/hub/signup", headers=HTTPHeaders(
        {"X-Forwarded-For": "127.0.0.1, 203.0.113.9, 127.0.0.1"}))
    assert account_pages.client_address(forged, trusted=("127.0.0.1",)) == "203.0.113.9"
    only_proxy = HTTPServerRequest(method="POST", uri="/hub/signup", headers=HTTPHeaders(
        {"X-Forwarded-For": "127.0.0.1"}))
    assert account_pages.client_address(only_proxy, trusted=("127.0.0.1",)) == "127.0.0.1"


@pytest.mark.unit
@pytest.mark.timing
def test_a_sign_ups_password_is_hashed_off_the_event_loop_and_429_beyond_the_cap(authenticator_db, tmp_path,
                                                                                 monkeypatch):
    """The attack (issue 27, 4): each sign-up hashed its password on the hub's event loop,
    so 32 of them took /hub/api/ from 9 ms to 2.4 s. Hashes run in the login checks' own
    threads while the loop goes on, and beyond LOGIN_CHECKS_AT_MOST in flight a sign-up
    gets 429."""
    import asyncio
    import threading

    from tornado import web

    import pdl_spawner.accounts.login_guard as guard

    auth = make_authenticator(authenticator_db, tmp_path)
    threads, release, real_hash = set(), threading.Event(), bcrypt.hashpw

    def slow_hash(password, salt):
        threads.add(threading.current_thread().name)
        release.wait(10)
        return real_hash(password, salt)

    monkeypatch.setattr(bcrypt, "hashpw", slow_hash)
    extra = 3

    async def sign_ups():
        tasks = [asyncio.create_task(auth.hash_password(f"passphrase-{i}"))
                 for i in range(guard.LOGIN_CHECKS_AT_MOST + extra)]
        started = time.monotonic()
        for _ in range(5):  # the loop keeps turning while every hash waits
            await asyncio.sleep(0.02)
        turned_in = time.monotonic() - started
        release.set()
        return turned_in, await asyncio.gather(*tasks, return_exceptions=True)

    turned_in, answers = asyncio.run(sign_ups())
    assert turned_in < 2, turned_in
    hashes = [a for a in answers if isinstance(a, bytes)]
    refused = [a for a in answers if isinstance(a, web.HTTPError)]
    assert len(hashes) == guard.LOGIN_CHECKS_AT_MOST and len(refused) == extra, answers
    assert all(e.status_code == 429 for e in refused)
    assert bcrypt.checkpw(b"passphrase-0", hashes[0])
    assert threads and all(name.startswith("pdl-login-check") for name in threads), threads


@pytest.mark.unit
def test_sign_up_codes_are_private_one_per_name_and_work_once(tmp_path):
    """Guards ``credentials.SignupCodes``: a restart (``ensure`` again) keeps each code and
    never makes a used one new; the file is mode 0600 from the start; a code works for
    its own name only, once."""
    from pdl_spawner.accounts.credentials import SignupCodes

    codes = SignupCodes(tmp_path / "state")
    first = codes.ensure(["ann", "ben"])
    assert set(first) == {"ann", "ben"} and first["ann"] != first["ben"] and len(first["ann"]) >= 20
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "signup-codes").st_mode) == 0o600
    assert codes.ensure(["ann", "ben"]) == first
    assert not codes.use("ann", first["ben"]) and codes.state("ann") == "open"
    assert codes.use("ann", first["ann"]) and codes.state("ann") == "used"
    assert not codes.use("ann", first["ann"]) and not codes.matches("ann", first["ann"])
    assert codes.ensure(["ann", "ben", "kate"]).keys() == {"ben", "kate"}  # ann's stays used
    assert codes.state("zoe") is None


@pytest.mark.unit
def test_wrong_password_counts_are_forgotten_an_hour_after_the_last_for_every_name(authenticator_db, tmp_path):
    """Counts of made-up names cannot fill the hub's memory: each count is kept
    FAILED_LOGINS_KEPT_S after its last wrong password, whether the name has an account or not."""
    import asyncio

    from pdl_spawner.accounts.login_guard import FAILED_LOGINS_KEPT_S

    auth = make_authenticator(authenticator_db, tmp_path)

    async def wrong(name: str) -> None:
        assert await auth.authenticate(None, {"username": name, "password": "not-the-password"}) is None

    async def logins() -> None:
        for name in ("admin", "made-up-0", "made-up-1"):
            await wrong(name)
    asyncio.run(logins())
    assert {key[0] for key in auth.login_attempts} == {"admin", "made-up-0", "made-up-1"}
    for attempts in auth.login_attempts.values():  # as if their last password came an hour ago
        attempts["time"] -= FAILED_LOGINS_KEPT_S
    asyncio.run(wrong("made-up-2"))
    assert list(auth.login_attempts) == [("made-up-2", False)]


@pytest.mark.unit
def test_a_login_field_past_its_bound_gets_400_in_one_line_and_an_over_long_password_is_a_wrong_one(
        authenticator_db, tmp_path, monkeypatch):
    """The attack (issue 60, 1): 120 failed logins with 1 MB names grew the hub by 131 MiB,
    for an hour: the lockout kept each name. Now a name past NAME_CHARS (or a one-time
    code past TOKEN_CHARS) is refused with 400 before anything reads it, saying the bound
    and quoting none of it; a password past PASSWORD_CHARS is a wrong password, counted,
    never hashed (a stand-in is checked, so that it takes as long as any); and a name
    that can never log in is kept nowhere."""
    import asyncio

    from tornado import web

    import pdl_spawner.accounts.authenticator as accounts
    from pdl_spawner.accounts import form_limits

    auth = make_authenticator(authenticator_db, tmp_path)
    checked = []
    real_check = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, hashed: checked.append(len(password))
                        or real_check(password, hashed))

    def login(**data):
        return asyncio.run(auth.authenticate(None, {"username": "admin", "password": "not-it", **data}))

    for field, most in (("username", form_limits.NAME_CHARS), ("2fa", form_limits.TOKEN_CHARS)):
        with pytest.raises(web.HTTPError) as refused:
            login(**{field: "x" * (most + 1) + "-the-tail"})
        line = refused.value.log_message
        assert refused.value.status_code == 400 and f"at most {most} characters" in line, line
        assert "\n" not in line and "xxxxxxxxxx" not in line and "the-tail" not in line, line
    assert not auth.login_attempts and not checked  # nothing counted, nothing checked

    assert login(password="p" * (form_limits.PASSWORD_CHARS + 1)) is None
    assert auth.login_attempts[("admin", False)]["count"] == 1  # a wrong one, counted
    assert len(checked) == 1 and checked[0] < 72  # a stand-in checked (as long as any), never the password
    assert login(username="Not A Name " + "x" * 200) is None  # the decoy's check: as long as any
    assert list(auth.login_attempts) == [("admin", False)] and len(checked) == 2
    assert accounts.name_problem("x" * 200 + "!").startswith("'xxxxxxxxx") and len(accounts.name_problem(
        "x" * 200 + "!")) < 200  # a refusal quotes at most 40 characters of a name

    problem = form_limits.signup_problem({"username": "ann", "signup_password": "a-fine-passphrase",
                                          "email": "a" * 120 + "@lab.example.org"})
    assert problem == "The e-mail address may have at most 128 characters; this one has 136."
    assert form_limits.signup_problem({"username": "ann", "signup_password": "p" * 1025}) == (
        "The password may have at most 1024 characters; this one has 1025.")


@pytest.mark.unit
def test_the_lockout_keeps_at_most_names_kept_counts_the_oldest_forgotten_first(authenticator_db, tmp_path):
    """The attack (issue 60, 1): the lockout's dict had no bound in all. Now it keeps at
    most NAMES_KEPT counts; beyond, the one whose last wrong password is oldest goes, and
    a name counted again is the newest."""
    from pdl_spawner.accounts.login_guard import NAMES_KEPT

    auth = make_authenticator(authenticator_db, tmp_path)
    for i in range(NAMES_KEPT):
        auth.add_login_attempt((f"n{i}", False))
    auth.add_login_attempt(("n0", False))  # n0 again: now the newest, n1 the oldest
    for i in range(3):
        auth.add_login_attempt((f"more-{i}", False))
    kept = list(auth.login_attempts)
    assert len(kept) == NAMES_KEPT
    assert ("n1", False) not in kept and ("n3", False) not in kept and ("n4", False) in kept
    assert kept[-4:] == [("n0", False), ("more-0", False), ("more-1", False), ("more-2", False)]
    assert auth.login_attempts[("n0", False)]["count"] == 2


@pytest.mark.unit
def test_sign_up_counts_keep_at_most_their_addresses_the_oldest_forgotten_first(authenticator_db, tmp_path):
    """The attack (issue 60, 1): the sign-up counts kept every client address that ever
    signed up. Now at most SIGNUP_ADDRESSES_KEPT addresses (the one whose last sign-up
    is oldest goes first), each kept by its first ADDRESS_CHARS characters."""
    from pdl_spawner.accounts.authenticator import ADDRESS_CHARS, SIGNUP_ADDRESSES_KEPT

    auth = make_authenticator(authenticator_db, tmp_path, signups_per_address=3)
    for _ in range(50):
        auth.count_signup("203.0.113.9")
    assert auth.signup_rate_full("203.0.113.9").startswith("3 sign-ups from your address")
    for tail in "abc":  # a made-up address of 10,000 characters is kept by its first ADDRESS_CHARS
        auth.count_signup("x" * 10_000 + tail)
    assert auth.signup_rate_full("x" * ADDRESS_CHARS).startswith("3 sign-ups from your address")
    for i in range(SIGNUP_ADDRESSES_KEPT - 1):
        auth.count_signup(f"2001:db8::{i:x}")
    assert auth.signup_rate_full("203.0.113.9") is None  # the oldest, forgotten
    assert auth.signup_rate_full("x" * ADDRESS_CHARS).startswith("3 sign-ups")  # kept: SIGNUP_ADDRESSES_KEPT in all
    auth.count_signup("2001:db8::0")
    auth.count_signup("2001:db8::0")
    assert auth.signup_rate_full("2001:db8::0").startswith("3 sign-ups")
    auth.count_signup("198.51.100.7")
    assert auth.signup_rate_full("x" * ADDRESS_CHARS) is None  # now the oldest, forgotten
    assert auth.signup_rate_full("2001:db8::0").startswith("3 sign-ups")  # counted again last: kept
