"""Logins with the lab's own accounts, through JupyterHub's own authenticators, with PDL's
hardening around them.

:class:`GuardedLogin` goes before a JupyterHub authenticator among a class's bases and
sends its password check through a :class:`~pdl_spawner.accounts.login_guard.LoginGuard`:
wrong passwords lock a name as PDL's own login does, one check runs at a time per name,
a bounded number hub-wide (HTTP 429 beyond), in the guard's pool, never on the hub's
event loop. The login form's fields are bounded first
(:mod:`~pdl_spawner.accounts.form_limits`; the login page,
:class:`~pdl_spawner.accounts.pages.LabLoginHandler`, refuses them before the
authenticator hears of them, and fills a refused name back only within its bound): a
name of over 256 characters gets HTTP 400 in one line; a password of over 1,024 is a
wrong one, counted, that the lab's check never hears of (it checks a random stand-in
instead, so that the answer takes as long). A name is normalised (Unicode NFKC, then
JupyterHub's lowercasing) and must be
:data:`~pdl_spawner.accounts.unix_accounts.NAME_PATTERN` before the authenticator hears
of it; another is refused as a wrong password is, and nothing of it is kept (the guard
keeps counts for names that can log in only).

- :class:`PDLPAMAuthenticator`: JupyterHub's :class:`~jupyterhub.auth.PAMAuthenticator`
  (the machine's own passwords: ``/etc/shadow``, or LDAP through ``pam_sss`` or
  ``pam_ldap``).
- :class:`PDLLDAPAuthenticator`: ``jupyterhub-ldapauthenticator``'s
  :class:`~ldapauthenticator.LDAPAuthenticator` (a bind as the person to the lab's
  directory), which may also let in the members of a Unix group as the machine
  resolves it (the directory's groups, through nslcd or sssd).
- :class:`PDLOIDCAuthenticator`: the lab's single sign-on (OpenID Connect), through
  ``oauthenticator``'s :class:`~oauthenticator.generic.GenericOAuthenticator`: no password
  reaches the hub; the name the provider vouches for (its ``username_claim``) is
  normalised the same way and must be a hub user's name. :func:`discover` reads the
  provider's endpoints from its discovery document.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import secrets
import unicodedata

import requests
from jupyterhub.auth import Authenticator, PAMAuthenticator
from jupyterhub.handlers.login import LoginHandler as HubLoginHandler
from ldap3.core.exceptions import LDAPException, LDAPSocketOpenError
from ldapauthenticator import LDAPAuthenticator
from oauthenticator.generic import GenericOAuthenticator
from tornado import web
from traitlets import Integer, Unicode, default

from pdl_spawner.accounts import form_limits, unix_accounts
from pdl_spawner.accounts.login_guard import LoginGuard, remember_browser
from pdl_spawner.accounts.pages import LabLoginHandler
from pdl_spawner.accounts.unix_accounts import NAME_PATTERN


class GuardedLogin(Authenticator):
    """PDL's hardening around the password check of the authenticator after it among a
    class's bases (see the module docstring). Its settings apply to every guarded login
    (``c.GuardedLogin``), or to one (``c.PDLPAMAuthenticator``...)."""

    allowed_failed_logins = Integer(5, config=True, help="Wrong passwords in a row after which a name is locked "
                                    "(0: never).")
    seconds_before_next_try = Integer(60, config=True, help="Seconds a locked name waits after its last failure.")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.guard = LoginGuard(self)
        #: counts of wrong passwords, by (name, known browser): the guard's
        self.login_attempts = self.guard.attempts

    def normalize_username(self, username: str) -> str:
        """Unicode NFKC, then JupyterHub's (lowercase, ``username_map``)."""
        return super().normalize_username(unicodedata.normalize("NFKC", username))

    def check_password(self, handler, data: dict):
        """The next authenticator's own check, run where it is called (the guard's pool,
        a thread without an event loop): what it returns (the name or a user model, or
        None for a wrong password)."""
        check = super().authenticate
        plain = getattr(check, "__wrapped__", None)  # one that runs itself on an executor (PAM's)
        found = plain(self, handler, data) if plain is not None else check(handler, data)
        return asyncio.run(found) if inspect.iscoroutine(found) else found

    async def authenticate(self, handler, data):
        """What the check returns for the right password; None for a wrong one or a name
        that cannot be a hub user's; HTTP 403 while the name is locked, 429 while its last
        guess (from the same kind of browser) is checked or the hub checks too many logins;
        400 for a field past its bound (:func:`~pdl_spawner.accounts.form_limits.login_problem`)."""
        problem = form_limits.login_problem(data)
        if problem:
            raise web.HTTPError(400, problem)
        username = self.normalize_username(data.get("username", ""))
        key = self.guard.key(handler, username)
        if key is None:  # never a hub user's name: nothing to check, count or keep
            return None
        checked = {**data, "username": username}
        if not form_limits.checkable_password(data.get("password", "")):  # a wrong one, as long as any
            checked["password"] = secrets.token_urlsafe(16)  # a stand-in, never the answer
        found = await self.guard.check(key, lambda: self.check_password(handler, checked))
        if found is None:
            return None
        self.guard.passed(key)
        remember_browser(handler, username)
        return found

    def get_handlers(self, app):
        """JupyterHub's, with its login page bounding the form's fields (LabLoginHandler)."""
        return [(route, LabLoginHandler if handler is HubLoginHandler else handler)
                for route, handler in super().get_handlers(app)]


class PDLPAMAuthenticator(GuardedLogin, PAMAuthenticator):
    """PAM with PDL's hardening (see the module docstring)."""


class PDLLDAPAuthenticator(GuardedLogin, LDAPAuthenticator):
    """The lab's LDAP directory with PDL's hardening (see the module docstring). A
    directory that does not answer is a one-line 503, not a hub error."""

    allowed_unix_group = Unicode("", config=True, help="A Unix group, as the machine resolves it (the directory's "
                                 "groups through nslcd or sssd), whose members may log in besides allowed_users "
                                 "and allowed_groups; empty: none.")

    def check_password(self, handler, data: dict):
        try:
            return super().check_password(handler, data)
        except LDAPSocketOpenError:
            raise web.HTTPError(503, f"The lab's directory (LDAP at {self.server_address}:{self.server_port}) "
                                "does not answer: try again later.") from None
        except LDAPException as e:
            raise web.HTTPError(503, f"The lab's directory (LDAP at {self.server_address}:{self.server_port}) "
                                f"failed: {type(e).__name__}.") from None

    async def check_allowed(self, username: str, auth_model: dict | None = None) -> bool:
        """LDAPAuthenticator's rule (allowed users, its groups by DN), or a member of
        :attr:`allowed_unix_group` (looked up in a thread: NSS may ask the directory)."""
        if await super().check_allowed(username, auth_model):
            return True
        group = self.allowed_unix_group
        return bool(group) and await asyncio.to_thread(unix_accounts.in_group, username, group)


class PDLOIDCAuthenticator(GenericOAuthenticator):
    """The lab's single sign-on (see the module docstring); the name is the provider's
    ``preferred_username`` claim unless ``username_claim`` says otherwise."""

    @default("username_claim")
    def _preferred_username(self):
        return "preferred_username"

    def normalize_username(self, username: str) -> str:
        """Unicode NFKC, then oauthenticator's (lowercase, ``username_map``)."""
        return super().normalize_username(unicodedata.normalize("NFKC", username))

    def validate_username(self, username: str) -> bool:
        """JupyterHub's check, and the name must be a hub user's (NAME_PATTERN): a
        provider's name with a space, a slash or an ``@`` logs nobody in."""
        return super().validate_username(username) and re.fullmatch(NAME_PATTERN, username) is not None


#: Seconds the provider's discovery document may take (the hub waits for it once, at start).
DISCOVERY_TIMEOUT_S = 10


def discover(issuer: str) -> dict[str, str]:
    """The endpoints of the OpenID Connect provider ``issuer`` from its discovery document
    (``<issuer>/.well-known/openid-configuration``): ``authorize_url``, ``token_url`` and
    ``userdata_url``, as oauthenticator names them. ValueError (one line) when it does not
    answer, or names another issuer or lacks one of them."""
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=DISCOVERY_TIMEOUT_S)
        answer.raise_for_status()
        document = answer.json()
    except (requests.RequestException, ValueError) as e:
        raise ValueError(f"the OpenID Connect provider's discovery document {url} could not be read: "
                         f"{type(e).__name__}") from None
    if str(document.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
        raise ValueError(f"{url} names the issuer {str(document.get('issuer'))[:80]!r}, not {issuer!r}")
    names = {"authorize_url": "authorization_endpoint", "token_url": "token_endpoint",
             "userdata_url": "userinfo_endpoint"}
    missing = [field for field in names.values() if not document.get(field)]
    if missing:
        raise ValueError(f"{url} lacks {', '.join(missing)}")
    return {ours: document[theirs] for ours, theirs in names.items()}


#: The lab's logins' settable classes, the shared one first: the admin's guide and the
#: settings check list them.
LAB_LOGINS = (GuardedLogin, PDLPAMAuthenticator, PDLLDAPAuthenticator, PDLOIDCAuthenticator)
