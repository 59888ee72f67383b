"""The hub's own secrets for people: the admin's generated first password, and one
one-time sign-up code per listed user (pdl_spawner/accounts/authenticator.py uses both).

Both live in the hub's state folder (mode 0700, root's when the hub runs as root), in
files made with mode 0600 from the start, and are what ``scripts/serve`` prints.
"""

from __future__ import annotations

import fcntl
import hmac
import os
import secrets
from collections.abc import Iterable
from pathlib import Path


def secret_file(state_dir: str | os.PathLike, name: str, nbytes: int) -> str:
    """The secret stored in ``state_dir/name``, created (random, mode 0600) on first use."""
    path = Path(state_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(nbytes))
    return path.read_text().strip()


#: Bytes of randomness in the admin's first password (43 characters; bcrypt takes at most 72 bytes).
ADMIN_PASSWORD_BYTES = 32
#: The file of sign-up codes in the state folder: one ``<name> <code>`` line per listed
#: user, the code ``-`` once used.
SIGNUP_CODES_FILE = "signup-codes"
#: Bytes of randomness in a sign-up code (22 characters).
SIGNUP_CODE_BYTES = 16
USED = "-"


class SignupCodes:
    """The one-time sign-up codes of a hub's listed users, in ``state_dir/signup-codes``.

    A listed name (other than the first admin, whose account the hub makes) signs up
    only with its code, which the admin hands to that person (``scripts/serve`` prints
    a link with it); a code works once, for its own name. Every method takes the file's
    lock, so two hub threads or a hub and ``scripts/serve`` never lose a line."""

    def __init__(self, state_dir: str | os.PathLike):
        self.path = Path(state_dir) / SIGNUP_CODES_FILE

    def _read(self) -> dict[str, str]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return {}
        return {p[0]: p[1] for p in (line.split() for line in lines) if len(p) == 2}

    def _write(self, codes: dict[str, str]) -> None:
        temporary = self.path.with_name(f".{SIGNUP_CODES_FILE}.new")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{name} {code}\n" for name, code in codes.items()))
        os.replace(temporary, self.path)

    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path.with_name(f".{SIGNUP_CODES_FILE}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return os.fdopen(fd, "w")  # closing it releases the lock

    def ensure(self, names: Iterable[str]) -> dict[str, str]:
        """Make a code for each of ``names`` that has none yet (a used one stays used);
        the codes not used yet, by name."""
        with self._locked():
            codes = self._read()
            missing = [n for n in names if n not in codes]
            if missing:
                codes.update({n: secrets.token_urlsafe(SIGNUP_CODE_BYTES) for n in missing})
                self._write(codes)
            return {n: c for n, c in codes.items() if c != USED}

    def state(self, name: str) -> str | None:
        """``"open"`` (a code waits for ``name``), ``"used"``, or None (no code: not listed
        at start, e.g. added at /hub/admin later)."""
        code = self._read().get(name)
        return None if code is None else ("used" if code == USED else "open")

    def matches(self, name: str, code: str) -> bool:
        """Whether ``code`` is ``name``'s unused code (compared in constant time)."""
        wanted = self._read().get(name)
        return bool(wanted) and wanted != USED and hmac.compare_digest(wanted.encode(), code.encode())

    def use(self, name: str, code: str) -> bool:
        """Mark ``name``'s code used if ``code`` is it; whether it was (once only)."""
        with self._locked():
            codes = self._read()
            wanted = codes.get(name)
            if not wanted or wanted == USED or not hmac.compare_digest(wanted.encode(), code.encode()):
                return False
            codes[name] = USED
            self._write(codes)
            return True
