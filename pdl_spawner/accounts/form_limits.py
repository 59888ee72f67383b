"""The most characters the hub takes in each field of its login and sign-up forms.

A field is measured before anything else reads it: before a name is normalised, counted
by the lockout, looked up or logged, and before a password is checked or hashed. A value
past its bound gets HTTP 400 and one line that names the field and its bound and quotes
none of the value (:func:`login_problem`, :func:`signup_problem`); a login's password past
:data:`PASSWORD_CHARS` is a wrong password instead, counted as one and checked by
nothing (:func:`checkable_password`). A page that fills a refused name back into its
form fills it only within :data:`NAME_CHARS` (:func:`shown_name`).
"""

from __future__ import annotations

from collections.abc import Mapping

#: A user name as typed, before NFKC and lowercasing. A hub user's name has at most 20
#: characters (``NAME_PATTERN``) and a Unix login at most 32; the rest leaves room for a
#: name the admin's ``username_map`` maps onto one (an e-mail address has at most 254).
NAME_CHARS = 256
#: A password. bcrypt takes at most 72 bytes (a sign-up's password must fit), PAM at most
#: 512 (``PAM_MAX_RESP_SIZE``); an LDAP bind sends it whole to the directory.
PASSWORD_CHARS = 1024
#: A sign-up's e-mail address: the width of NativeAuthenticator's ``users_info.email`` column.
EMAIL_CHARS = 128
#: A login's one-time token (``2fa``: 6 digits), a sign-up's ``2fa`` box (``on``) and a
#: sign-up code (``?code=``: 22 characters).
TOKEN_CHARS = 64

#: The login form's bounded fields (a password: :func:`checkable_password`): field -> (what it is, bound).
LOGIN_FIELDS = {"username": ("The user name", NAME_CHARS), "2fa": ("The one-time code", TOKEN_CHARS)}
#: The sign-up form's fields: field -> (what it is, bound); and its link's ``code``.
SIGNUP_FIELDS = {
    "username": ("The user name", NAME_CHARS),
    "signup_password": ("The password", PASSWORD_CHARS),
    "signup_password_confirmation": ("The password's confirmation", PASSWORD_CHARS),
    "email": ("The e-mail address", EMAIL_CHARS),
    "2fa": ("The two-factor choice", TOKEN_CHARS),
    "code": ("The sign-up code", TOKEN_CHARS),
}


def too_long(values: Mapping[str, object], bounds: Mapping[str, tuple[str, int]]) -> str | None:
    """One line for the first of ``values`` (field -> value as sent) past its bound in
    ``bounds``: what the field is, its bound and the value's length, nothing of the
    value; None when each fits (a field that is not a string is left to its reader)."""
    for field, (what, most) in bounds.items():
        value = values.get(field)
        if isinstance(value, str) and len(value) > most:
            return f"{what} may have at most {most} characters; this one has {len(value)}."
    return None


def login_problem(data: Mapping[str, object]) -> str | None:
    """:func:`too_long` for a login's ``data`` (the fields JupyterHub's login form sent)."""
    return too_long(data, LOGIN_FIELDS)


def signup_problem(values: Mapping[str, object]) -> str | None:
    """:func:`too_long` for a sign-up's fields (and its ``code``)."""
    return too_long(values, SIGNUP_FIELDS)


def checkable_password(password: object) -> bool:
    """Whether a login's ``password`` is worth a check: a string within :data:`PASSWORD_CHARS`."""
    return isinstance(password, str) and len(password) <= PASSWORD_CHARS


def shown_name(username: str | None) -> str | None:
    """``username`` as a page fills it back into the form's name field: as typed within
    :data:`NAME_CHARS`, else empty."""
    if username is None or len(username) <= NAME_CHARS:
        return username
    return ""
