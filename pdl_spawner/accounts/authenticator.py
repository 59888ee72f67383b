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
  with it, as ``/hub/signup?code=...``, the name is approved at once; without it the
  sign-up is refused (HTTP 403, one line), so a stranger cannot claim a listed name
  first. Any other name, a name added at ``/hub/admin`` later included, waits until an
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
- **Names are not told.** A name without an account gets the answer of a wrong password,
  after as long (a bcrypt check against a decoy hash of the same cost), and is counted
  and locked the same way: before, a missing name answered in 53 ms and an account's
  wrong password in 719 ms, and only existing names were ever locked.
- **A lock a stranger cannot keep closed.** A browser that logged in as a name keeps a
  signed cookie saying so (the guard's ``KNOWN_BROWSER_COOKIE``, HttpOnly,
  SameSite=Strict, the hub's path). Counts, locks and the one check at a time are kept
  apart for such a browser and for every other one: a stranger's guesses lock the name
  for browsers that never logged in as it, while its owner's browser still gets in (one
  wrong guess each time the lock ended kept its owner out for good before this).
- **Sign-ups are bounded.** At most ``pending_signups_at_most`` (20) names wait for the
  admin's approval, and one client address signs up at most ``signups_per_address`` (10)
  unlisted names in ``signup_window_seconds`` (600); beyond either, HTTP 429 with one
  line, before the password is hashed. The hash is made in the password checks' own
  pool and counts against their cap (429 beyond), never on the hub's event loop (32
  anonymous sign-ups, each hashed there, stalled the hub for seconds). Listed names
  and admins can always sign up.
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
from collections import deque
from pathlib import Path

import bcrypt
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from tornado import web
from traitlets import Bool, Integer, Unicode, default

from pdl_spawner.accounts.pages import DiscardHandler, LoginHandler, SignUpHandler, ToggleAuthorizationHandler
from pdl_spawner.accounts.credentials import ADMIN_PASSWORD_BYTES, SignupCodes, secret_file
from pdl_spawner.accounts.login_guard import LoginGuard, remember_browser
from pdl_spawner.accounts.unix_accounts import NAME_PATTERN

#: The most bytes of a password that bcrypt takes (bcrypt 5 raises ValueError beyond).
BCRYPT_MAX_BYTES = 72
#: NativeAuthenticator's templates; its page.html adds "Change Password" and, for admins,
#: "Authorize Users" to every page's bar when it comes first in ``JupyterHub.template_paths``.
TEMPLATE_DIR = native.TEMPLATE_DIR


def name_problem(name: str) -> str | None:
    """One line saying why ``name``, as it is (JupyterHub lowercases names first), cannot be a
    hub user's name; None if it can."""
    if re.fullmatch(NAME_PATTERN, name):
        return None
    return (f"{name!r} is not a valid name: use a lowercase letter followed by at most 19 lowercase letters, "
            "digits, '_' or '-'.")


def password_matches(hashed: bytes, password: str) -> bool:
    """Whether ``password`` is the one the bcrypt hash ``hashed`` was made from (False for
    one that bcrypt cannot take)."""
    encoded = password.encode()
    return len(encoded) <= BCRYPT_MAX_BYTES and bcrypt.checkpw(encoded, hashed)


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
        10, config=True, help="Sign-ups of unlisted names one client address may make in signup_window_seconds.")
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
        self.guard = LoginGuard(self.login_attempts, self)
        #: client address -> monotonic times of its sign-ups of unlisted names in the window
        self._signups: dict[str, deque[float]] = {}
        #: the hash a login for a name without an account is checked against (made now, off the loop)
        self._decoy_hash: bytes | None = None
        self.guard.pool.submit(self.decoy_hash)
        self.ensure_first_admin()

    @property
    def signup_codes(self) -> SignupCodes:
        """The listed users' one-time sign-up codes, beside the first admin's password file."""
        return SignupCodes(Path(self.first_admin_password_file).parent)

    def listed_claim_problem(self, username: str, code: str) -> str | None:
        """One line saying why signing up as ``username`` with sign-up ``code`` is refused:
        the name waits for its listed person, and ``code`` is not their one-time code.
        None for a name without a waiting code, and for the right code."""
        name = self.normalize_username(username)
        if self.signup_codes.state(name) != "open" or self.signup_codes.matches(name, code):
            return None
        return (f"{name} is on this hub's list: sign up with the link the admin gave you "
                "(scripts/serve prints one for each listed user).")

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

    def pending_signups_full(self, username: str) -> str | None:
        """One line saying why a sign-up as ``username`` must wait (HTTP 429): too many
        unlisted names already wait for the admin's approval. None for a listed name or
        an admin, and while there is room."""
        if self.is_listed(username):
            return None
        pending = self.db.query(UserInfo).filter(UserInfo.is_authorized.is_(False)).count()
        if pending < self.pending_signups_at_most:
            return None
        return (f"{pending} sign-ups already wait for the admin's approval, the most this hub keeps: "
                "try again once the admin has answered them.")

    def is_listed(self, username: str) -> bool:
        """Whether ``username`` is an admin's or in ``allowed_users`` (approved at sign-up)."""
        return self.normalize_username(username) in self.get_authed_users()

    def signup_rate_full(self, address: str, username: str) -> str | None:
        """One line saying why ``address`` may not sign up ``username`` now (HTTP 429): it
        signed up ``signups_per_address`` unlisted names in the window. None for a listed
        name or an admin, and while there is room. Nothing is counted here: see
        :meth:`count_signup`."""
        if self.is_listed(username):
            return None
        times = self._signups.get(address)
        now = time.monotonic()
        while times and now - times[0] >= self.signup_window_seconds:
            times.popleft()
        if not times or len(times) < self.signups_per_address:
            return None
        wait = self.signup_window_seconds - (now - times[0])
        return (f"{len(times)} sign-ups from your address in the last {self.signup_window_seconds // 60} minutes, "
                f"the most this hub takes: try again in {wait:.0f} s.")

    def count_signup(self, address: str, username: str) -> None:
        """Count one sign-up of ``username`` from ``address`` (listed names are not counted)."""
        if not self.is_listed(username):
            self._signups.setdefault(address, deque()).append(time.monotonic())
            for stale in [a for a, t in self._signups.items() if not t]:
                del self._signups[stale]

    async def hash_password(self, password: str) -> bytes:
        """``password``'s bcrypt hash, made in the password checks' pool; HTTP 429 while
        ``LOGIN_CHECKS_AT_MOST`` checks and hashes are in flight."""
        if self.guard.full():
            raise web.HTTPError(429, "The hub is checking many logins now: try again in a moment.")
        self.guard.busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.guard.pool, bcrypt.hashpw, password.encode(), bcrypt.gensalt())
        finally:
            self.guard.busy -= 1

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
        tells which names have accounts."""
        username = self.normalize_username(data.get("username", ""))
        password = data.get("password", "")
        info = self.get_user(username)
        key = self.guard.key(handler, username)
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
