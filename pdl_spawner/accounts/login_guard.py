"""PDL's hardening of a password login, whatever checks the password (PDL's own accounts,
PAM, ...): one :class:`LoginGuard` per authenticator.

- **Lockout.** After ``allowed_failed_logins`` wrong passwords for a name in a row, every
  password, the right one too, is refused (HTTP 403, one line saying for how long) until
  ``seconds_before_next_try`` seconds after the last failure. A password is counted
  before it is checked; a right one clears the count, and so does
  :data:`FAILED_LOGINS_KEPT_S` without one.
- **Bounded counts.** Only names that can be a hub user's (``NAME_PATTERN``: at most 20
  characters) are counted: the caller answers any other as a wrong password with key
  None, which keeps nothing. At most :data:`NAMES_KEPT` counts are kept, the one whose
  last wrong password is oldest forgotten first (about 400 bytes each, 4 MiB in all),
  so made-up names cannot fill the hub's memory. To make the guard forget a name's
  count, a stranger must send wrong passwords for :data:`NAMES_KEPT` other names after
  its last one: at PDL's own login, where each costs a bcrypt check (about 0.2 s, in
  :data:`LOGIN_CHECK_THREADS` threads), about 15 minutes, longer than the lock.
- **One check at a time** per name: guesses sent at once get HTTP 429 instead of a check
  each. At most :data:`LOGIN_CHECKS_AT_MOST` checks (and sign-up hashes) are in flight
  hub-wide, in a pool of :data:`LOGIN_CHECK_THREADS` threads of their own; beyond, 429.
- **A lock a stranger cannot keep closed.** A browser that logged in as a name keeps a
  signed cookie saying so (:data:`KNOWN_BROWSER_COOKIE`); counts, locks and the one
  check at a time are kept apart for such a browser and for every other one.

Counts live in the hub's memory: a restart clears them. Times are monotonic seconds.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tornado import web

from pdl_spawner.accounts.unix_accounts import NAME_PATTERN

#: Threads that check passwords (bcrypt or PAM, slow on purpose), a pool of their own.
LOGIN_CHECK_THREADS = 2
#: Password checks waiting or running at once, hub-wide; a login beyond gets HTTP 429
#: (80 wrong logins at once made another user's spawn take 45 s instead of 12).
LOGIN_CHECKS_AT_MOST = 16
#: Seconds a name's count of wrong passwords is kept after its last one.
FAILED_LOGINS_KEPT_S = 3600
#: Counts of wrong passwords kept at most, hub-wide; beyond, the one whose last wrong
#: password is oldest is forgotten.
NAMES_KEPT = 10_000
#: The cookie (``{name}``: the hub user's name) by which a browser that logged in as that
#: name keeps its own login count; signed with the hub's cookie secret.
KNOWN_BROWSER_COOKIE = "pdl-known-{name}"
#: Days a browser stays known after its last login.
KNOWN_BROWSER_DAYS = 90

#: What counts are kept by: (the hub user's name, whether the browser logged in as it
#: before); None for a name that can never log in (nothing counted, locked or kept).
Key = tuple[str, bool]


def is_known_browser(handler: web.RequestHandler | None, username: str) -> bool:
    """Whether the request carries the signed cookie of a browser that logged in as
    ``username`` within ``KNOWN_BROWSER_DAYS`` (False without a handler)."""
    if handler is None:
        return False
    value = handler.get_signed_cookie(KNOWN_BROWSER_COOKIE.format(name=username), max_age_days=KNOWN_BROWSER_DAYS)
    return value == username.encode()


def remember_browser(handler: web.RequestHandler | None, username: str) -> None:
    """Give the browser of ``handler``'s request the signed cookie that makes it known
    for ``username`` (nothing without a handler)."""
    if handler is None:
        return
    # Secure as JupyterHub's own cookies are: over an https public URL (a proxy in front
    # may reach the hub in plain HTTP), else over an https request
    public_url = handler.settings.get("public_url")
    secure = public_url.scheme == "https" if public_url else handler.request.protocol == "https"
    handler.set_signed_cookie(KNOWN_BROWSER_COOKIE.format(name=username), username,
                              expires_days=KNOWN_BROWSER_DAYS, path=handler.hub.base_url, httponly=True,
                              secure=secure, samesite="Strict")


class LoginGuard:
    """Counts, locks and the checks in flight of one authenticator (see the module docstring).

    ``settings``: the authenticator, whose ``allowed_failed_logins`` (0: never locked)
    and ``seconds_before_next_try`` are read at each login."""

    def __init__(self, settings: Any) -> None:
        #: key -> {"count", "time"}, the oldest last wrong password first (the
        #: authenticator's ``login_attempts``)
        self.attempts: OrderedDict[Key, dict] = OrderedDict()
        self.settings = settings
        #: keys whose password is being checked now: one check at a time each
        self.checking: set[Key] = set()
        #: other work that shares the checks' pool and cap (sign-up hashes) now
        self.busy = 0
        self.pool = ThreadPoolExecutor(LOGIN_CHECK_THREADS, thread_name_prefix="pdl-login-check")

    def key(self, handler: web.RequestHandler | None, username: str) -> Key | None:
        """What ``username``'s (normalised) counts are kept by for ``handler``'s browser;
        None for a name that can never log in (not :data:`NAME_PATTERN`)."""
        if re.fullmatch(NAME_PATTERN, username) is None:
            return None
        return username, is_known_browser(handler, username)

    def count(self, key) -> None:
        """Count one password for ``key`` (a name, or a :data:`Key`); forget the counts
        whose last password is over :data:`FAILED_LOGINS_KEPT_S` old, and the oldest
        beyond :data:`NAMES_KEPT`."""
        now = time.monotonic()
        while self.attempts and now - next(iter(self.attempts.values()))["time"] >= FAILED_LOGINS_KEPT_S:
            self.attempts.popitem(last=False)
        count = self.attempts.pop(key, {}).get("count", 0)
        self.attempts[key] = {"count": count + 1, "time": now}  # the newest, last
        while len(self.attempts) > NAMES_KEPT:
            self.attempts.popitem(last=False)

    def seconds_locked(self, key) -> float:
        """Seconds until ``key`` may try a password again (0: now)."""
        attempts = self.attempts.get(key)
        allowed = self.settings.allowed_failed_logins
        if not allowed or not attempts or attempts["count"] < allowed:
            return 0.0
        return max(0.0, self.settings.seconds_before_next_try - (time.monotonic() - attempts["time"]))

    def full(self) -> bool:
        """Whether :data:`LOGIN_CHECKS_AT_MOST` checks and hashes are in flight."""
        return len(self.checking) + self.busy >= LOGIN_CHECKS_AT_MOST

    async def run(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` (blocking) in the guard's pool, counted against its cap: HTTP
        429 while :data:`LOGIN_CHECKS_AT_MOST` checks and hashes are in flight."""
        if self.full():
            raise web.HTTPError(429, "The hub is checking many logins now: try again in a moment.")
        self.busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, work, *args)
        finally:
            self.busy -= 1

    async def check(self, key: Key | None, password_check: Callable[[], Any]) -> Any:
        """Run ``password_check`` (blocking: in the guard's pool) for ``key``, counted
        first: HTTP 403 while ``key`` is locked, 429 while its last check runs or the
        hub-wide cap is reached. Returns what the check returned; the caller clears the
        count of a right password (:meth:`passed`). Key None (a name that can never log
        in): only the cap applies, and nothing is counted."""
        if key is None:
            return await self.run(password_check)
        username = key[0]
        wait = self.seconds_locked(key)
        if wait:
            raise web.HTTPError(403, f"Too many failed logins for {username}: try again in {wait:.0f} s.")
        if key in self.checking:  # guesses at once would each get a check before any counted
            raise web.HTTPError(429, f"A login for {username} is being checked: try again in a moment.")
        if self.full():
            raise web.HTTPError(429, "The hub is checking many logins now: try again in a moment.")
        self.checking.add(key)
        self.count(key)  # counted before the check; a right password clears it
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, password_check)
        finally:
            self.checking.discard(key)

    def passed(self, key: Key) -> None:
        """A right password for ``key``: its count cleared (the caller remembers the
        browser, :func:`remember_browser`, once the login is let in)."""
        self.attempts.pop(key, None)
