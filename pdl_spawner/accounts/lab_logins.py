"""Logins with the lab's own accounts, through JupyterHub's own authenticators, with PDL's
hardening around them.

:class:`PDLPAMAuthenticator` is JupyterHub's :class:`~jupyterhub.auth.PAMAuthenticator`
(the machine's own passwords: ``/etc/shadow``, or LDAP through ``pam_sss`` or
``pam_ldap``) whose checks go through a :class:`~pdl_spawner.accounts.login_guard.LoginGuard`:
wrong passwords lock a name as PDL's own login does, one check runs at a time per name,
a bounded number hub-wide (HTTP 429 beyond), in the guard's pool, never on the hub's
event loop. A name is normalised (Unicode NFKC, then JupyterHub's lowercasing) and must
be :data:`~pdl_spawner.accounts.unix_accounts.NAME_PATTERN` before PAM hears of it;
another is refused as a wrong password is, after being counted.
"""

from __future__ import annotations

import re
import unicodedata

from jupyterhub.auth import PAMAuthenticator
from traitlets import Integer

from pdl_spawner.accounts.login_guard import LoginGuard, remember_browser
from pdl_spawner.accounts.unix_accounts import NAME_PATTERN


class PDLPAMAuthenticator(PAMAuthenticator):
    """PAM with PDL's hardening (see the module docstring)."""

    allowed_failed_logins = Integer(5, config=True, help="Wrong passwords in a row after which a name is locked "
                                    "(0: never).")
    seconds_before_next_try = Integer(60, config=True, help="Seconds a locked name waits after its last failure.")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: counts of wrong passwords, by (name, known browser)
        self.login_attempts: dict = {}
        self.guard = LoginGuard(self.login_attempts, self)

    def normalize_username(self, username: str) -> str:
        """Unicode NFKC, then JupyterHub's (lowercase, ``username_map``)."""
        return super().normalize_username(unicodedata.normalize("NFKC", username))

    def check_password(self, handler, data: dict) -> str | None:
        """PAMAuthenticator's own check (PAM's authenticate and account check), run
        where it is called (the guard's pool): the name, or None."""
        return PAMAuthenticator.authenticate.__wrapped__(self, handler, data)

    async def authenticate(self, handler, data):
        """The name for the right password of an account PAM knows; None for a wrong one
        or a name that cannot be a hub user's; HTTP 403 while the name is locked, 429
        while its last guess (from the same kind of browser) is checked or the hub checks
        too many logins."""
        username = self.normalize_username(data.get("username", ""))
        key = self.guard.key(handler, username)
        valid = re.fullmatch(NAME_PATTERN, username) is not None
        checked = {**data, "username": username}
        found = await self.guard.check(key, lambda: self.check_password(handler, checked) if valid else None)
        if found is None:
            return None
        self.guard.passed(key)
        remember_browser(handler, username)
        return found
