"""Each hub user's own login: jupyterhub-nativeauthenticator, fitted to PDL and JupyterHub 6.

:class:`PDLAuthenticator` (``c.JupyterHub.authenticator_class``) keeps NativeAuthenticator's
accounts (the ``users_info`` table of the hub's database, bcrypt hashes) and its pages
(``/hub/signup``, ``/hub/authorize``, ``/hub/change-password``). Its contract:

- **The first admin.** At hub start, ``first_admin`` gets an account, authorized, whose
  password is the one in ``first_admin_password_file`` (made by
  :func:`~pdl_spawner.accounts.credentials.secret_file`, random and mode 0600, when missing: the
  password ``scripts/serve`` prints). An existing account is never touched: once the
  admin changes their password at ``/hub/change-password``, the file keeps the first one.
- **Everyone else signs up** at ``/hub/signup`` with a password of their own: at least
  ``minimum_password_length`` (8) characters, not a common one, at most 72 bytes
  (bcrypt's limit). A name listed at hub start (``PDL_USERS``) has a one-time sign-up
  code (:class:`~pdl_spawner.accounts.credentials.SignupCodes`, in the folder of
  ``first_admin_password_file``; ``scripts/serve`` prints a link with it for each):
  with it, as ``/hub/signup?code=...``, the name is approved at once; without it (or
  with another code) the sign-up makes nothing and is answered as an unlisted name's
  (below), so a stranger can neither claim a listed name first nor tell that it is
  listed. Any other name, a name added at ``/hub/admin`` later included, waits until an
  admin authorizes it at ``/hub/authorize``. ``enable_signup`` (default: the hub runs as root) turns the
  page off (404): without root every server would run as the hub's own Unix user.
- **Logging in** takes an authorized account and its password, nothing else:
  :meth:`~PDLAuthenticator.check_allowed` asks the account, not only ``allowed_users``
  (JupyterHub 5+ would refuse every approved name that is not listed).
- **Lockout.** After ``allowed_failed_logins`` (5) wrong passwords for a name in a row,
  every password, the right one too, is refused until ``seconds_before_next_try`` (60)
  seconds after the last failure, and the login page says for how long. Then one more
  wrong password locks it again; a right one clears the count, and so does an hour
  without one. Counts live in the hub's memory: a restart
  clears them. A password is counted before it is checked, and a name
  has one check at a time: guesses sent at once get HTTP 429 instead of a check each
  (40 at once were all checked, none refused as locked, before this). Checks run in
  a pool of their own, a bounded number at once hub-wide; beyond, HTTP 429. These rules
  are :class:`~pdl_spawner.accounts.login_guard.LoginGuard`'s, which any password login
  of PDL's uses.
- **Names are not told.** At login, a name without an account gets the answer of a
  wrong password, after as long (a bcrypt check against a decoy hash of the same cost),
  and is counted and locked the same way: before, a missing name answered in 53 ms and
  an account's wrong password in 719 ms, and only existing names were ever locked. At
  sign-up, the checks that do not depend on the name's account come first (the
  fields' bounds, the caps below, the name's form, the password's strength, its
  confirmation); then a name that has an account (approved or waiting) or waits for
  its listed person's code gets, after the same bcrypt hash in the same pool, counted
  per address and checked against the waiting list's cap as any other, the answer of a
  new unlisted name ("Signed up: you can log in once an admin approves <name>."), and
  nothing is made (:meth:`~PDLAuthenticator.sign_up`): before, a taken name was
  "already in use" and a free one was told about its password. Only the number of
  names waiting differs (a free name adds one): someone who fills the waiting list to
  one below its cap can tell from the next sign-up's 429 whether one name was free, and
  each such try leaves a name waiting for the admin.
- **A lock a stranger cannot keep closed.** A browser that logged in as a name keeps a
  signed cookie saying so (the guard's ``KNOWN_BROWSER_COOKIE``, HttpOnly,
  SameSite=Strict, the hub's path). Counts, locks and the one check at a time are kept
  apart for such a browser and for every other one: a stranger's guesses lock the name
  for browsers that never logged in as it, while its owner's browser still gets in (one
  wrong guess each time the lock ended kept its owner out for good before this).
- **Sign-ups are bounded.** At most ``pending_signups_at_most`` (20) names wait for the
  admin's approval, and one client address makes at most ``signups_per_address`` (10)
  sign-ups without a one-time code in ``signup_window_seconds`` (600), whatever the
  name; beyond either, HTTP 429 with one line, before the password is hashed. The hash
  is made in the password checks' own pool and counts against their cap (429 beyond),
  never on the hub's event loop (32 anonymous sign-ups, each hashed there, stalled the
  hub for seconds). A sign-up with its one-time code is never held by either cap. The
  counts per address keep at most :data:`SIGNUP_ADDRESSES_KEPT` addresses, the one
  whose last sign-up is oldest forgotten first.
- **What a visitor makes the hub keep is bounded.** Each field of the login and sign-up
  forms is bounded before anything reads it (:mod:`~pdl_spawner.accounts.form_limits`:
  a name of at most 256 characters, a password of at most 1,024, an e-mail address of
  at most 128; past its bound, HTTP 400 with one line that quotes none of it; a login's
  over-long password is a wrong one). The lockout keeps counts for names that can log
  in only (at most 20 characters), at most ``login_guard.NAMES_KEPT`` (10,000) of them,
  each for at most an hour (:mod:`~pdl_spawner.accounts.login_guard`); refusals quote
  at most 40 characters of a name.
- **Names** are normalised (Unicode NFKC, then JupyterHub's lowercasing) before anything
  else, and must be :data:`~pdl_spawner.accounts.unix_accounts.NAME_PATTERN`, as each becomes a
  Unix account (``pdl-<name>``). A sign-up must type the name in ASCII (``\u212Aate``, with
  a Kelvin sign, would otherwise become ``kate``); another name gets one line that says
  what a valid name is.
- ``/hub/authorize/<name>`` and ``/hub/discard/<name>`` (links that change state on a
  GET) refuse requests that another site started (cross-site request forgery).

Fixes for JupyterHub 6 (NativeAuthenticator 1.3.0): the login page's ``_render`` takes
the error page's namespace (JupyterHub renders login errors through it), a password of
over 72 bytes is an ordinary refusal instead of bcrypt 5's ValueError (an HTTP 500), and
bcrypt runs off the hub's event loop at login.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import unicodedata
from collections import OrderedDict, deque
from pathlib import Path

import bcrypt
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from tornado import web
from traitlets import Bool, Integer, Unicode, default

from pdl_spawner.accounts import form_limits
from pdl_spawner.accounts.pages import DiscardHandler, LoginHandler, SignUpHandler, ToggleAuthorizationHandler
from pdl_spawner.accounts.credentials import ADMIN_PASSWORD_BYTES, SignupCodes, secret_file
from pdl_spawner.accounts.login_guard import LoginGuard, remember_browser
from pdl_spawner.accounts.unix_accounts import NAME_PATTERN
from pdl_spawner.core.form import echo

#: The most bytes of a password that bcrypt takes (bcrypt 5 raises ValueError beyond).
BCRYPT_MAX_BYTES = 72
#: Client addresses whose sign-ups are counted at most (``signups_per_address``); beyond,
#: the one whose last sign-up is oldest is forgotten (about 1 KiB each, 4 MiB in all).
SIGNUP_ADDRESSES_KEPT = 4096
#: Characters of a client address kept (an IPv6 address has at most 45).
ADDRESS_CHARS = 64
#: NativeAuthenticator's templates; its page.html adds "Change Password" and, for admins,
#: "Authorize Users" to every page's bar when it comes first in ``JupyterHub.template_paths``.
TEMPLATE_DIR = native.TEMPLATE_DIR


def name_problem(name: str) -> str | None:
    """One line saying why ``name``, as it is (JupyterHub lowercases names first), cannot be a
    hub user's name (quoting at most its first 40 characters); None if it can."""
    if re.fullmatch(NAME_PATTERN, name):
        return None
    return (f"{echo(name)} is not a valid name: use a lowercase letter followed by at most 19 lowercase letters, "
            "digits, '_' or '-'.")


def password_matches(hashed: bytes, password: str) -> bool:
    """Whether ``password`` is the one the bcrypt hash ``hashed`` was made from. One that
    bcrypt cannot take (over :data:`BCRYPT_MAX_BYTES`), or past the form's bound, is
    never right: False after a check of a stand-in, as long as any wrong password takes
    (so that such guesses cost what others do)."""
    if not form_limits.checkable_password(password) or len(password.encode()) > BCRYPT_MAX_BYTES:
        bcrypt.checkpw(b"a stand-in, never the answer", hashed)
        return False
    return bcrypt.checkpw(password.encode(), hashed)


class PDLAuthenticator(NativeAuthenticator):
    """NativeAuthenticator with PDL's rules; the contract is the module's docstring."""

    first_admin = Unicode(
        "", config=True,
        help="The admin whose account is made at hub start (the first of PDL_USERS).",
    )
    first_admin_password_file = Unicode(
        "", config=True,
        help="File with the first admin's first password (made, random and mode 0600, when missing).",
    )
    enable_signup = Bool(
        config=True,
        help="Whether /hub/signup is open. Default: when the hub runs as root, as each user then "
             "runs as their own Unix account.",
    )
    minimum_password_length = Integer(8, config=True, help="Fewest characters of a new password.")
    check_common_password = Bool(True, config=True, help="Refuse passwords on the list of common ones.")
    pending_signups_at_most = Integer(
        20, config=True, help="Sign-ups of unlisted names that may wait for the admin's approval at once.")
    signups_per_address = Integer(
        10, config=True, help="Sign-ups without a one-time code one client address may make in "
                              "signup_window_seconds.")
    signup_window_seconds = Integer(600, config=True, help="The window of signups_per_address, seconds.")
    allowed_failed_logins = Integer(
        5, config=True, help="Wrong passwords in a row after which a name is locked (0: never).")
    seconds_before_next_try = Integer(
        60, config=True, help="Seconds a locked name waits after its last failure.")

    @default("enable_signup")
    def _signup_when_root(self):
        return os.geteuid() == 0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: counts, locks and checks in flight (pdl_spawner/accounts/login_guard.py); bcrypt
        #: runs in its pool: a flood of logins cannot take the hub's default pool, which
        #: resolves addresses and prepares accounts
        self.guard = LoginGuard(self)
        #: counts of wrong passwords, by (name, known browser): the guard's
        self.login_attempts = self.guard.attempts
        #: client address -> monotonic times of its last sign-ups without a code, the
        #: address whose last one is oldest first
        self._signups: OrderedDict[str, deque[float]] = OrderedDict()
        #: the hash a login for a name without an account is checked against (made now, off the loop)
        self._decoy_hash: bytes | None = None
        self.guard.pool.submit(self.decoy_hash)
        self.ensure_first_admin()

    @property
    def signup_codes(self) -> SignupCodes:
        """The listed users' one-time sign-up codes, beside the first admin's password file."""
        return SignupCodes(Path(self.first_admin_password_file).parent)

    def has_signup_code(self, username: str, code: str) -> bool:
        """Whether ``code`` is the one-time sign-up code waiting for ``username`` (a listed
        name, as typed: in ASCII and valid once normalised)."""
        if not code or self.signup_name_problem(username):
            return False
        return self.signup_codes.matches(self.normalize_username(username), code)

    def ensure_first_admin(self) -> None:
        """Give ``first_admin`` an authorized account with the password file's password,
        unless they have one (then it is left as it is)."""
        if not self.first_admin or self.get_user(self.first_admin) is not None:
            return
        problem = name_problem(self.normalize_username(self.first_admin))
        if problem:
            raise ValueError(f"the first admin: {problem}")
        path = Path(self.first_admin_password_file)
        password = secret_file(path.parent, path.name, ADMIN_PASSWORD_BYTES)
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
        self.db.add(UserInfo(username=self.normalize_username(self.first_admin), password=hashed,
                             is_authorized=True))
        self.db.commit()
        self.log.info("Made the account of the admin %s (password in %s)", self.first_admin, path)

    # -- names and passwords ---------------------------------------------------

    def normalize_username(self, username: str) -> str:
        """Unicode NFKC, then JupyterHub's (lowercase, ``username_map``)."""
        return super().normalize_username(unicodedata.normalize("NFKC", username))

    def validate_username(self, username: str) -> bool:
        return name_problem(username) is None and super().validate_username(username)

    def password_problem(self, password: str) -> str | None:
        """One line saying why ``password`` cannot be a new password; None if it can."""
        if len(password) < self.minimum_password_length:
            return f"The password must have at least {self.minimum_password_length} characters."
        if len(password.encode()) > BCRYPT_MAX_BYTES:
            return f"The password must have at most {BCRYPT_MAX_BYTES} bytes."
        if self.check_common_password and self.is_password_common(password):
            return "This password is too common: choose another one."
        return None

    def signup_name_problem(self, username: str) -> str | None:
        """One line saying why ``username``, as typed at sign-up, is refused: not ASCII (a
        look-alike: ``\u212Aate`` would become ``kate``), or not a valid name once
        normalised; None if it is fine."""
        if not username.isascii() or name_problem(self.normalize_username(username)):
            return name_problem(username)  # worded with the name as it was typed
        return None

    def signup_problem(self, username: str, password: str) -> str | None:
        """One line saying why signing up as ``username`` with ``password`` is refused; None if it is not."""
        return self.signup_name_problem(username) or self.password_problem(password)

    def pending_signups_full(self) -> str | None:
        """One line saying why a sign-up without a one-time code must wait (HTTP 429): too
        many names already wait for the admin's approval. None while there is room."""
        pending = self.db.query(UserInfo).filter(UserInfo.is_authorized.is_(False)).count()
        if pending < self.pending_signups_at_most:
            return None
        return (f"{pending} sign-ups already wait for the admin's approval, the most this hub keeps: "
                "try again once the admin has answered them.")

    def signup_rate_full(self, address: str) -> str | None:
        """One line saying why ``address`` may not sign up now without a one-time code
        (HTTP 429): it made ``signups_per_address`` such sign-ups in the window. None while
        there is room. Nothing is counted here: see :meth:`count_signup`."""
        times = self._signups.get(address[:ADDRESS_CHARS])
        now = time.monotonic()
        while times and now - times[0] >= self.signup_window_seconds:
            times.popleft()
        if not times or len(times) < self.signups_per_address:
            return None
        wait = self.signup_window_seconds - (now - times[0])
        return (f"{len(times)} sign-ups from your address in the last {self.signup_window_seconds // 60} minutes, "
                f"the most this hub takes: try again in {wait:.0f} s.")

    def count_signup(self, address: str) -> None:
        """Count one sign-up without a one-time code from ``address`` (its first
        :data:`ADDRESS_CHARS` characters); forget the addresses whose last sign-up left
        the window, and the oldest beyond :data:`SIGNUP_ADDRESSES_KEPT`. Each address
        keeps its last ``signups_per_address`` times only: all that its limit reads."""
        address, now = address[:ADDRESS_CHARS], time.monotonic()
        while self._signups and now - next(iter(self._signups.values()))[-1] >= self.signup_window_seconds:
            self._signups.popitem(last=False)
        times = self._signups.pop(address, None) or deque(maxlen=max(1, self.signups_per_address))
        times.append(now)
        self._signups[address] = times  # the newest, last
        while len(self._signups) > SIGNUP_ADDRESSES_KEPT:
            self._signups.popitem(last=False)

    async def hash_password(self, password: str) -> bytes:
        """``password``'s bcrypt hash, made in the password checks' pool; HTTP 429 while
        ``LOGIN_CHECKS_AT_MOST`` checks and hashes are in flight."""
        return await self.guard.run(bcrypt.hashpw, password.encode(), bcrypt.gensalt())

    def sign_up(self, username: str, password: str, password_hash: bytes, approved: bool, **kwargs) -> UserInfo | None:
        """The account a sign-up that passed every check makes (``approved``: with its
        one-time code), or, for a name that has an account or waits for its listed
        person's code (``approved`` false), the same account unsaved: the sign-up is
        answered as a new name that waits for approval, and nothing is made. None where
        NativeAuthenticator refuses the sign-up (an invalid e-mail address)."""
        name = self.normalize_username(username)
        if self.user_exists(name) or (not approved and self.signup_codes.state(name) == "open"):
            try:
                return UserInfo(username=name, password=password_hash, is_authorized=False, **kwargs)
            except AssertionError:  # an invalid e-mail address, as create_user
                return None
        return self.create_user(name, password, password_hash=password_hash, approved=approved, **kwargs)

    def create_user(self, username, password, password_hash: bytes | None = None, approved: bool | None = None,
                    **kwargs):
        """NativeAuthenticator's, taking the hash made by :meth:`hash_password` (hashing here,
        on the caller's thread, only without one), approved as ``approved`` says (None:
        admins and ``allowed_users``); None when the name is taken or invalid, the password
        weak, or sign-up closed."""
        username = self.normalize_username(username)
        if (not self.enable_signup or self.user_exists(username) or not self.validate_username(username)
                or not self.is_password_strong(password)):
            return None
        hashed = password_hash or bcrypt.hashpw(password.encode(), bcrypt.gensalt())
        try:
            if approved is None:
                approved = self.open_signup or username in self.get_authed_users()
            info = UserInfo(username=username, password=hashed, is_authorized=approved, **kwargs)
        except AssertionError:  # an invalid e-mail address
            return None
        self.db.add(info)
        self.db.commit()
        return info

    def is_password_strong(self, password: str) -> bool:
        return self.password_problem(password) is None

    # -- logging in --------------------------------------------------------------

    def add_login_attempt(self, key) -> None:
        """Count one password for ``key``: a name, or a (name, known browser) pair (the guard's)."""
        self.guard.count(key)

    def decoy_hash(self) -> bytes:
        """A bcrypt hash of a random password, of the cost of the accounts' own: what a login
        for a name without an account is checked against, so that it takes as long."""
        if self._decoy_hash is None:
            self._decoy_hash = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt())
        return self._decoy_hash

    def seconds_locked(self, key) -> float:
        """Seconds until ``key`` (as in :meth:`add_login_attempt`) may try a password again (0: now)."""
        return self.guard.seconds_locked(key)

    def is_blocked(self, username: str) -> bool:
        return self.seconds_locked((username, False)) > 0

    async def authenticate(self, handler, data):
        """The name, for an authorized account's right password (and two-factor token,
        if it has one); None for a wrong one; HTTP 403 with the reason when the name is
        locked or not yet approved, 429 while the same browser kind's last guess for it
        is being checked. A browser that logged in as the name before counts apart.
        A name without an account is answered as one with a wrong password, in as long
        (checked against :meth:`decoy_hash`), counted and locked the same way: nothing
        tells which names have accounts. 400 for a field past its bound
        (:func:`~pdl_spawner.accounts.form_limits.login_problem`); a name that can never
        log in (not ``NAME_PATTERN``) is checked against the decoy and kept nowhere."""
        problem = form_limits.login_problem(data)
        if problem:
            raise web.HTTPError(400, problem)
        username = self.normalize_username(data.get("username", ""))
        password = data.get("password", "")
        key = self.guard.key(handler, username)  # None: a name that can never log in, nothing kept
        info = self.get_user(username) if key is not None else None
        if info is not None:
            hashed = info.password
        else:  # the decoy, made once (in the pool: it is slow on purpose)
            hashed = self._decoy_hash or await asyncio.get_running_loop().run_in_executor(
                self.guard.pool, self.decoy_hash)
        right = await self.guard.check(key, lambda: password_matches(hashed, password))
        if info is None:
            return None
        if right and info.has_2fa:
            right = info.is_valid_token(data.get("2fa"))
        if not right:
            return None
        self.successful_login(key)  # a right password clears this browser kind's count
        if not info.is_authorized:
            raise web.HTTPError(403, f"{username} is waiting for an admin's approval.")
        remember_browser(handler, username)
        return username

    def check_allowed(self, username, authentication=None) -> bool:
        """Allowed: whoever has an authorized account (what :meth:`authenticate` checked)."""
        info = self.get_user(username)
        return bool(info and info.is_authorized)

    def get_handlers(self, app):
        fitted = {native.LoginHandler: LoginHandler, native.SignUpHandler: SignUpHandler,
                  native.ToggleAuthorizationHandler: ToggleAuthorizationHandler,
                  native.DiscardHandler: DiscardHandler}
        return [(route, fitted.get(handler, handler)) for route, handler in super().get_handlers(app)]
