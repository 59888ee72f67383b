"""A hub whose users are the lab's own accounts (``PDL_ACCOUNTS=lab``): nobody signs up,
each logs in with the lab's password (PAM's or the directory's, as ``login_env`` says)
and runs as the existing Unix account of their own name, in its own home. The accounts
are the test's to make and remove (local ones with ``useradd``, or the people of a
:mod:`lab_directory`)."""

from __future__ import annotations

import pwd
from pathlib import Path

from hub_harness import Hub


class LabAccounts:
    """What a hub of the lab's accounts changes of :class:`hub_harness.Hub` (put first
    among the bases of a hub of any kind); the subclass sets ``passwords`` (by name)."""

    passwords: dict[str, str]

    def sign_up_listed_users(self) -> None:
        """Nobody signs up: the accounts are the lab's."""

    def account(self, user: str) -> str:
        return user

    def home(self, user: str) -> Path:
        return Path(pwd.getpwnam(user).pw_dir)

    def password(self, user: str) -> str:
        return self.passwords[user]

    def delete_account(self, user: str) -> None:
        """The lab's accounts, and their associations on a cluster, outlive the hub (the
        test removes them)."""


class LabHub(LabAccounts, Hub):
    """:class:`hub_harness.Hub` with the lab's accounts: ``passwords`` by name, the
    login's settings in ``login_env`` (``PDL_AUTH``... ; ``PDL_ACCOUNTS=lab`` added)."""

    def __init__(self, root: Path, users: list[str], pool: list[str], passwords: dict[str, str],
                 login_env: dict[str, str], **kwargs):
        hub_env = {**kwargs.pop("hub_env", {}), **login_env, "PDL_ACCOUNTS": "lab"}
        super().__init__(root, users, pool, hub_env=hub_env, **kwargs)
        self.passwords = dict(passwords)
