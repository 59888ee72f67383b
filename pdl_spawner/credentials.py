"""The admin's generated first password (pdl_spawner/accounts.py makes their account with it)."""

from __future__ import annotations

import os
import secrets
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
