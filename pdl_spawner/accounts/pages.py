"""The hub's account pages: NativeAuthenticator's login, sign-up and approval handlers,
fitted to PDL (:class:`~pdl_spawner.accounts.authenticator.PDLAuthenticator` routes to them).

- Login: a field past its bound gets HTTP 400, the page with one line, before the
  authenticator hears of it (:func:`refused_past_bounds`); then JupyterHub 6's own form
  handling (a lockout or an expired form renders as an error, never an HTTP 500); a
  refusal fills the name field back only within its bound
  (:func:`~pdl_spawner.accounts.form_limits.shown_name`), here and on the lab's logins'
  page (:class:`LabLoginHandler`).
- Login and sign-up let go of the request's body once they answered (:class:`ForgetsItsBody`).
- Sign-up: a field past its bound gets HTTP 400 with one line
  (:mod:`~pdl_spawner.accounts.form_limits`); then it says why the name's form, the
  password or its confirmation is refused; 429 when too many sign-ups wait already,
  come from the client's address (:func:`client_address`), or are being hashed; the
  password is hashed off the event loop. A sign-up answers the same, in words and in
  time, whether its name has an account or not (see
  :class:`~pdl_spawner.accounts.authenticator.PDLAuthenticator`'s contract).
- Approving or discarding a name: from the hub's own pages only
  (:func:`refuse_cross_site`), and 404 for a name without an account.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlparse

from jupyterhub.handlers.login import LoginHandler as HubLoginHandler
from jupyterhub.scopes import needs_scope
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from tornado import web
from tornado.escape import url_escape
from tornado.httputil import url_concat

from pdl_spawner.accounts import form_limits
from pdl_spawner.core.form import echo


def client_address(request, trusted: Collection[str] = ()) -> str:
    """The address of the client of ``request`` as the hub's proxy saw it: the last entry
    of ``X-Forwarded-For``, which the proxy appends to whatever the client sent (tornado's
    ``remote_ip`` would take a client's own ``X-Real-Ip``); the peer's address without one.
    Behind a reverse proxy of the lab's (``trusted``: its addresses, JupyterHub's
    ``trusted_downstream_ips``), the entry before the proxy's own, which it wrote."""
    forwarded = [a.strip() for a in ",".join(request.headers.get_list("X-Forwarded-For")).split(",") if a.strip()]
    while len(forwarded) > 1 and forwarded[-1] in trusted:
        forwarded.pop()
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


class ForgetsItsBody:
    """Mixin for the handler of a form anyone may post: once the answer is sent, the
    request lets go of its body and arguments. A rendered page leaves a reference cycle
    that holds its handler, and so the request (Jinja's context and macros), until
    Python's cycle collector runs: 300 refused logins of 768 KiB and 300 refused sign-ups
    of 512 KiB grew the hub by 34 MiB before this, under 1 MiB since."""

    def on_finish(self):
        super().on_finish()
        request = self.request
        request.body, request.body_arguments, request.arguments, request.files = b"", {}, {}, {}


class LoginHandler(ForgetsItsBody, native.LoginHandler):
    """NativeAuthenticator's login page, with JupyterHub 6's form handling."""

    def _render(self, login_error=None, username=None, **kwargs):
        # JupyterHub renders an error on a login POST (a lockout, an expired form) as
        # _render(**namespace of the error page, sync=True)
        return self.render_template(
            "native-login.html",
            next=url_escape(self.get_argument("next", default="")),
            username=form_limits.shown_name(username),
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
        if not await refused_past_bounds(self):
            await HubLoginHandler.post(self)


class LabLoginHandler(ForgetsItsBody, HubLoginHandler):
    """JupyterHub's login page, for the lab's logins (:mod:`~pdl_spawner.accounts.lab_logins`):
    a field past its bound refused first, and a refusal filling the name field back
    only within its bound."""

    def _render(self, login_error=None, username=None, **kwargs):
        return super()._render(login_error=login_error, username=form_limits.shown_name(username), **kwargs)

    async def post(self):
        if not await refused_past_bounds(self):
            await super().post()


async def refused_past_bounds(handler: HubLoginHandler) -> bool:
    """Whether ``handler``'s login was refused for a field past its bound
    (:func:`~pdl_spawner.accounts.form_limits.login_problem`): HTTP 400, the login page
    with that line, the name field empty; the authenticator never hears of it (and
    refuses it too, for whoever calls it otherwise). A refusal raised as an error would
    hold the request's fields until Python's cycle collector runs."""
    problem = form_limits.login_problem({field: handler.get_body_argument(field, "", strip=False)
                                         for field in form_limits.LOGIN_FIELDS})
    if problem is None:
        return False
    handler.set_status(400)
    handler.finish(await handler._render(login_error=problem, username=""))
    return True


class SignUpHandler(ForgetsItsBody, native.SignUpHandler):
    """NativeAuthenticator's sign-up page, saying why a sign-up was refused and that a
    name was approved at once with its one-time code; 429 when too many sign-ups wait
    already, come from the client's address, or are being hashed. The password is
    hashed off the event loop. NativeAuthenticator's reCAPTCHA and e-mail approval are
    not part of PDL's page."""

    async def post(self):
        auth = self.authenticator
        if not auth.enable_signup:
            raise web.HTTPError(404)
        fields = {name: self.get_body_argument(name, "", strip=False) for name in form_limits.SIGNUP_FIELDS
                  if name != "code"}
        code = self.get_query_argument("code", "")
        too_long = form_limits.signup_problem({**fields, "code": code})
        if too_long:  # before anything reads a field
            self.set_status(400)
            return self.finish(await self._page("alert-danger", too_long))
        username, password = fields["username"], fields["signup_password"]
        # nothing below depends on whether the name has an account, until the answer
        # (PDLAuthenticator.sign_up), which does not tell
        with_code = auth.has_signup_code(username, code)
        address = client_address(self.request, self.settings["config"].JupyterHub.get("trusted_downstream_ips", ()))
        if not with_code:
            refusal = auth.pending_signups_full() or auth.signup_rate_full(address)
            if refusal:
                raise web.HTTPError(429, refusal)
        problem = auth.signup_problem(username, password)
        if problem is None and password != fields["signup_password_confirmation"]:
            problem = "Your password did not match the confirmation. Please try again."
        if problem:
            return self.finish(await self._page("alert-danger", problem))
        if not with_code:
            auth.count_signup(address)
        hashed = await auth.hash_password(password)
        user = auth.sign_up(username, password, hashed, approved=with_code, email=fields["email"],
                            has_2fa=bool(fields["2fa"]))
        if user is not None and user.is_authorized and with_code:
            auth.signup_codes.use(user.username, code)
        alert, message = self.result_message(user)
        self.finish(await self._page(alert, message, user))

    async def _page(self, alert: str, message: str, user: UserInfo | None = None) -> str:
        """The sign-up page with ``message`` in its alert."""
        auth = self.authenticator
        return await self.render_template(
            "signup.html", ask_email=auth.ask_email_on_signup, result_message=message, alert=alert,
            two_factor_auth=auth.allow_2fa, two_factor_auth_user=user.has_2fa if user else "",
            two_factor_auth_value=user.otp_secret if user else "", recaptcha_key=auth.recaptcha_key, tos=auth.tos)

    def result_message(self, user: UserInfo | None) -> tuple[str, str]:
        """The alert and its line for a sign-up that passed every check: approved, waiting
        (or answered as if it were), or None (an e-mail address NativeAuthenticator refuses)."""
        if user is not None and user.is_authorized:
            return "alert-success", "Signed up and approved: you can log in now."
        if user is not None:
            return "alert-info", f"Signed up: you can log in once an admin approves {user.username}."
        return super().get_result_message(None, True, False, True, False)


class ToggleAuthorizationHandler(native.ToggleAuthorizationHandler):
    """Authorize or unauthorize a name: from the hub's own page only, and 404 for no account."""

    @needs_scope("admin:users")
    async def get(self, slug):
        refuse_cross_site(self)
        if UserInfo.find(self.db, slug) is None:
            raise web.HTTPError(404, f"No account {echo(slug)}.")
        await super().get(slug)


class DiscardHandler(native.DiscardHandler):
    """Discard a name's pending sign-up: from the hub's own page only."""

    @needs_scope("admin:users")
    async def get(self, user_name):
        refuse_cross_site(self)
        await super().get(user_name)
