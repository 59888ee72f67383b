"""The hub's account pages: NativeAuthenticator's login, sign-up and approval handlers,
fitted to PDL (:class:`~pdl_spawner.accounts.authenticator.PDLAuthenticator` routes to them).

- Login: JupyterHub 6's own form handling (a lockout or an expired form renders as an
  error, never an HTTP 500).
- Sign-up: says why one was refused and that a listed name was approved at once; 429
  when too many sign-ups wait already, come from the client's address
  (:func:`client_address`), or are being hashed; the password is hashed off the event
  loop.
- Approving or discarding a name: from the hub's own pages only
  (:func:`refuse_cross_site`), and 404 for a name without an account.
"""

from __future__ import annotations

from urllib.parse import urlparse

from jupyterhub.handlers.login import LoginHandler as HubLoginHandler
from jupyterhub.scopes import needs_scope
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from tornado import web
from tornado.escape import url_escape
from tornado.httputil import url_concat


def client_address(request) -> str:
    """The address of the client of ``request`` as the hub's proxy saw it: the last entry
    of ``X-Forwarded-For``, which the proxy appends to whatever the client sent (tornado's
    ``remote_ip`` would take a client's own ``X-Real-Ip``); the peer's address without one."""
    forwarded = [a.strip() for a in ",".join(request.headers.get_list("X-Forwarded-For")).split(",") if a.strip()]
    return forwarded[-1] if forwarded else request.remote_ip


def refuse_cross_site(handler: web.RequestHandler) -> None:
    """HTTP 403 unless the request comes from the hub's own pages, is typed in, or is
    scripted: JupyterHub skips its XSRF check on GET navigations, and a link on another
    site would otherwise authorize or discard a name in the admin's session."""
    site = handler.request.headers.get("Sec-Fetch-Site")
    referer = handler.request.headers.get("Referer")
    if site is not None:
        cross = site not in ("same-origin", "none")
    else:  # browsers without Fetch Metadata
        cross = bool(referer) and urlparse(referer).netloc != handler.request.host
    if cross:
        raise web.HTTPError(403, "Open this from the hub's /hub/authorize page.")


class LoginHandler(native.LoginHandler):
    """NativeAuthenticator's login page, with JupyterHub 6's form handling."""

    def _render(self, login_error=None, username=None, **kwargs):
        # JupyterHub renders an error on a login POST (a lockout, an expired form) as
        # _render(**namespace of the error page, sync=True)
        return self.render_template(
            "native-login.html",
            next=url_escape(self.get_argument("next", default="")),
            username=username,
            login_error=login_error,
            custom_html=self.authenticator.custom_html,
            login_url=self.settings["login_url"],
            enable_signup=self.authenticator.enable_signup,
            two_factor_auth=self.authenticator.allow_2fa,
            authenticator_login_url=url_concat(
                self.authenticator.login_url(self.hub.base_url), {"next": self.get_argument("next", "")}),
            **kwargs,
        )

    async def post(self):
        # JupyterHub's own: NativeAuthenticator's checks the password a second time to
        # word its refusal, and fails with HTTP 500 on a missing or over-long one
        await HubLoginHandler.post(self)


class SignUpHandler(native.SignUpHandler):
    """NativeAuthenticator's sign-up page, saying why a sign-up was refused and that a
    listed name was approved at once; 429 when too many sign-ups wait already, come from
    the client's address, or are being hashed. The password is hashed off the event loop.
    NativeAuthenticator's reCAPTCHA and e-mail approval are not part of PDL's page."""

    async def post(self):
        auth = self.authenticator
        if not auth.enable_signup:
            raise web.HTTPError(404)
        username = self.get_body_argument("username", "", strip=False)
        password = self.get_body_argument("signup_password", "", strip=False)
        matches = password == self.get_body_argument("signup_password_confirmation", "", strip=False)
        address = client_address(self.request)
        refusal = auth.pending_signups_full(username) or auth.signup_rate_full(address, username)
        if refusal:
            raise web.HTTPError(429, refusal)
        code = self.get_query_argument("code", "")
        name_ok = auth.signup_name_problem(username) is None
        taken = name_ok and auth.user_exists(username)
        claim = auth.listed_claim_problem(username, code) if name_ok and not taken else None
        if claim:
            self.set_status(403)
            return self.finish(await self._page("alert-danger", claim))
        user = None
        if not taken and matches and auth.signup_problem(username, password) is None:
            auth.count_signup(address, username)
            hashed = await auth.hash_password(password)
            with_code = bool(code) and auth.signup_codes.matches(auth.normalize_username(username), code)
            user = auth.create_user(username, password, password_hash=hashed, approved=with_code,
                                    email=self.get_body_argument("email", "", strip=False),
                                    has_2fa=bool(self.get_body_argument("2fa", "", strip=False)))
            if user is not None and with_code:
                auth.signup_codes.use(user.username, code)
        alert, message = self.get_result_message(user, True, taken, matches, username in auth.admin_users)
        self.finish(await self._page(alert, message, user))

    async def _page(self, alert: str, message: str, user: UserInfo | None = None) -> str:
        """The sign-up page with ``message`` in its alert."""
        auth = self.authenticator
        return await self.render_template(
            "signup.html", ask_email=auth.ask_email_on_signup, result_message=message, alert=alert,
            two_factor_auth=auth.allow_2fa, two_factor_auth_user=user.has_2fa if user else "",
            two_factor_auth_value=user.otp_secret if user else "", recaptcha_key=auth.recaptcha_key, tos=auth.tos)

    def get_result_message(self, user, assume_user_is_human, username_already_taken, confirmation_matches,
                           user_is_admin):
        if user is not None:
            if user.is_authorized:
                return "alert-success", "Signed up and approved: you can log in now."
            if not user.login_email_sent:
                return "alert-info", f"Signed up: you can log in once an admin approves {user.username}."
        if user is None and assume_user_is_human and not username_already_taken and confirmation_matches:
            problem = self.authenticator.signup_problem(self.get_body_argument("username", ""),
                                                        self.get_body_argument("signup_password", ""))
            if problem:
                return "alert-danger", problem
        return super().get_result_message(user, assume_user_is_human, username_already_taken,
                                          confirmation_matches, user_is_admin)


class ToggleAuthorizationHandler(native.ToggleAuthorizationHandler):
    """Authorize or unauthorize a name: from the hub's own page only, and 404 for no account."""

    @needs_scope("admin:users")
    async def get(self, slug):
        refuse_cross_site(self)
        if UserInfo.find(self.db, slug) is None:
            raise web.HTTPError(404, f"No account {slug!r}.")
        await super().get(slug)


class DiscardHandler(native.DiscardHandler):
    """Discard a name's pending sign-up: from the hub's own page only."""

    @needs_scope("admin:users")
    async def get(self, user_name):
        refuse_cross_site(self)
        await super().get(user_name)
