"""JupyterHub configuration for PDL's embedded default: one machine, local engines.

Start with ``jupyterhub -f jupyterhub_config.py`` (``scripts/serve`` does it all).
Environment variables tune it without editing this file:

- ``PDL_STATE_DIR``: where the hub keeps its database, cookie secret,
  reservations and generated password (default ``./.pdl/hub``);
- ``PDL_USERS``: comma-separated user names allowed to log in (default: the
  Unix user running the hub); the first one is the admin;
- ``PDL_HUB_PORT``: port on 127.0.0.1 (default 8000);
- ``PDL_POOL``: slots to share, e.g. ``gpu:0,gpu:1`` or ``cpu:0,cpu:1,cpu:2``
  (default: every GPU, else 4 CPU slots).

Login is JupyterHub's SharedPasswordAuthenticator, restricted to ``PDL_USERS``,
with random passwords generated on first start and stored with mode 0600 in
``$PDL_STATE_DIR/password`` (the admin's) and ``user-password`` (everyone else's). For a lab, switch to PAM or OAuth (see docs/admin.md).
"""

import getpass
import os
import secrets
from pathlib import Path

c = get_config()  # noqa: F821 - provided by JupyterHub

state_dir = Path(os.environ.get("PDL_STATE_DIR", ".pdl/hub")).resolve()
state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)


def _secret_file(name: str, nbytes: int) -> str:
    """Read a secret from state_dir, creating it (mode 0600) on first use."""
    path = state_dir / name
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(nbytes))
    return path.read_text().strip()


users = [u.strip() for u in os.environ.get("PDL_USERS", getpass.getuser()).split(",") if u.strip()]

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ.get("PDL_HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.db_url = f"sqlite:///{state_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state_dir / "jupyterhub.pid")
# Servers and their engines keep running across hub restarts; the reservation
# ledger and spawner state let the restarted hub take them back.
c.JupyterHub.cleanup_servers = False
c.ConfigurableHTTPProxy.pid_file = str(state_dir / "proxy.pid")

c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.admin_password = _secret_file("password", 32)
if len(users) > 1:  # the other listed users share their own random password
    c.SharedPasswordAuthenticator.user_password = _secret_file("user-password", 16)
c.Authenticator.admin_users = set(users[:1])
c.Authenticator.allowed_users = set(users)

c.JupyterHub.spawner_class = "pdl-local"
c.PDLLocalSpawner.reservations_db = str(state_dir / "reservations.sqlite")
c.PDLLocalSpawner.default_workers = 3
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
if os.environ.get("PDL_POOL"):
    c.PDLLocalSpawner.pool = [s.strip() for s in os.environ["PDL_POOL"].split(",") if s.strip()]
