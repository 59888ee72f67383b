"""The hub's configuration, from its environment: what ``jupyterhub_config.py`` runs.

:func:`configure` reads every ``PDL_*`` variable against the table
(:mod:`pdl_spawner.settings.variables`, and the chosen kind's), sets the traits they
name (``c.<Class>.<name>``, on the class that declares the setting, so that a kind's own
section in the admin's file still wins), and wires what every kind shares: the hub's
ports and public URL, its state folder (mode 0700), PDL's login, the users' home
skeleton, idle culling and the admin view. The kind (``PDL_SPAWNER``) is a plug-in
(:mod:`pdl_spawner.kinds`): its own settings are its ``configure``. Then the admin's own
file of ``c.*`` settings is loaded, when it exists and only root or the hub's user can
change it, and every ``c.<PDL class>.<name>`` is checked (:mod:`pdl_spawner.settings.checks`).

Any problem stops the hub with one line (SystemExit) naming what is valid.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pdl_spawner.host.account_limits import protect_hub
from pdl_spawner.accounts.authenticator import TEMPLATE_DIR, name_problem
from pdl_spawner.accounts.credentials import SignupCodes
from pdl_spawner.accounts.lab_logins import discover
from pdl_spawner.hub.hub_database import use_write_ahead_log
from pdl_spawner.hub.spawn_routes import fit_spawn_routes
from pdl_spawner.hub.public_url import default_public_url, public_url_problem
from pdl_spawner.hub.log_lines import bound_log_lines
from pdl_spawner.hub.tls import HTTPS_PORT, Access, access_problem, certificate_problem
from pdl_spawner.hub.request_limits import limit_request_bodies
from pdl_spawner.kinds import ClusterKind, kind_named, kinds
from pdl_spawner.settings.checks import unknown_setting
from pdl_spawner.settings.local_config import local_config_problem
from pdl_spawner.settings.variables import VARIABLES, read_variables

def configure(c, environ: Mapping[str, str], load_subconfig: Callable[[str], None], repo: Path) -> ClusterKind:
    """Configure the hub ``c`` from ``environ`` (see the module docstring); ``load_subconfig``
    is the config loader's, ``repo`` the folder of ``jupyterhub_config.py`` (its
    notebooks and the proxy scripts/setup installs). Returns the hub's kind."""
    os.umask(0o077)  # the hub's files (database, secrets, pid files) are its own from creation
    _stoppable_children()
    registered = kinds()
    try:
        kind = kind_named(environ.get("PDL_SPAWNER", "local").strip(), registered)
        found = read_variables(environ, kind, [k for k in registered.values() if k is not kind])
    except ValueError as e:
        raise SystemExit(str(e)) from None
    _set_traits(c, found, kind)
    state_dir = _state_dir(found["PDL_STATE_DIR"])
    _hub(c, found, state_dir, repo)
    kind.configure(c, found, state_dir)
    _login(c, found, state_dir)
    _servers(c, found, state_dir, kind, repo)
    _idle_culler(c, found["PDL_CULL_IDLE_S"])
    _local_config(c, found["PDL_LOCAL_CONFIG"], "PDL_LOCAL_CONFIG" in environ, load_subconfig)
    _lab_lockout(c)
    problem = unknown_setting(c, kind) or kind.problem(c) or _lab_login_problem(c)
    if problem:
        raise SystemExit(problem)
    _admin_view(c, kind, found["PDL_ADMIN_VIEW_PORT"], state_dir)
    _metrics(c, kind, found["PDL_PROMETHEUS_TOKEN_FILE"], state_dir)
    return kind


def _stoppable_children() -> None:
    """A hub started with SIGINT ignored (in the background of a script, ``bash
    scripts/serve &``) would pass that on to the proxy and services it starts before its
    own handler is in place: its SIGINT then waited for each service in turn (JupyterHub's
    ``interrupt_timeout``, 30 s), a minute for two. Its children start with SIGINT's default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _set_traits(c, found: Mapping[str, Any], kind: ClusterKind) -> None:
    for variable in (*VARIABLES, *kind.variables):
        if variable.trait and found.get(variable.name) is not None:
            section, _, name = variable.trait.partition(".")
            setattr(c[section], name, found[variable.name])


def _state_dir(path: str) -> Path:
    state_dir = Path(path).resolve()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    state_dir.chmod(0o700)  # also when it was made before, by hand: the hub's secrets live here
    return state_dir


def _hub(c, found: Mapping[str, Any], state_dir: Path, repo: Path) -> None:
    """Ports, public URL, database and secrets, the proxy, request limits."""
    # The hub, and the proxy and admin view it starts, are the last the OOM killer picks: the
    # users' processes (marked by the spawner) and their memory limits go first.
    if os.geteuid() == 0:
        protect_hub()
    c.JupyterHub.ip = found["PDL_HUB_IP"] or "127.0.0.1"  # a kind may choose another (Swarm: every interface)
    port = found["PDL_HUB_PORT"] or 8000
    # Each user's server is a web origin of its own, <name>.<host> beside the hub at <host>
    # (pdl_spawner/hub/public_url.py): a page a user serves cannot act as whoever opens it.
    public_url = found["PDL_PUBLIC_URL"] or default_public_url(port)
    if public_url_problem(public_url):
        raise SystemExit(public_url_problem(public_url))
    c.JupyterHub.subdomain_host = public_url.rstrip("/")
    # the hub's API and the proxy's stay on loopback, whatever the public port's address
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{found['PDL_PROXY_API_PORT']}"
    proxy = repo / ".pdl/node/node_modules/.bin/configurable-http-proxy"  # as scripts/setup installs it
    if proxy.exists():
        c.ConfigurableHTTPProxy.command = [str(proxy)]
    _lab_access(c, found, public_url)
    c.JupyterHub.db_url = f"sqlite:///{state_dir / 'jupyterhub.sqlite'}"
    use_write_ahead_log()  # its commits do not wait for the disk on the hub's event loop
    c.JupyterHub.cookie_secret_file = str(state_dir / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state_dir / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(state_dir / "proxy.pid")
    # servers and their engines keep running across hub restarts unless PDL_KEEP_SERVERS=0:
    # the reservations and the spawners' state let the next hub take them back
    c.JupyterHub.cleanup_servers = not found["PDL_KEEP_SERVERS"]
    limit_request_bodies(found["PDL_MAX_REQUEST_BYTES"])  # and the request line and headers
    bound_log_lines()  # a log line quotes at most 2,000 characters of what a visitor sent
    fit_spawn_routes()  # a refusal is answered before JupyterHub prepares the spawn


def _lab_access(c, found: Mapping[str, Any], public_url: str) -> None:
    """HTTPS (pdl_spawner/hub/tls.py): served by the hub's proxy with ``PDL_TLS_CERT`` and
    ``PDL_TLS_KEY`` (on the public URL's port unless ``PDL_HUB_PORT`` says otherwise, plain
    HTTP redirected from ``PDL_HTTP_PORT``), or by the lab's reverse proxy at
    ``PDL_TLS_PROXY``; over https every cookie is Secure (the hub's from its https public
    URL and its cookie options, the servers' from the same options), and with
    ``PDL_HSTS_S`` browsers keep to https."""
    url = urlsplit(public_url)
    access = Access(scheme=url.scheme, cert=found["PDL_TLS_CERT"] or "", key=found["PDL_TLS_KEY"] or "",
                    proxies=found["PDL_TLS_PROXY"] or (), http_port=found["PDL_HTTP_PORT"], hsts_s=found["PDL_HSTS_S"])
    problem = access_problem(access)
    if not problem and access.serves_tls:
        problem = certificate_problem(access.cert, access.key, url.hostname)
    if problem:
        raise SystemExit(problem)
    if access.serves_tls:
        c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = os.path.abspath(access.cert), os.path.abspath(access.key)
        if found["PDL_HUB_PORT"] is None:
            c.JupyterHub.port = url.port or HTTPS_PORT
        redirect = access.redirect_port()
        if redirect:  # configurable-http-proxy's own redirect, to the port browsers open
            command = [*c.ConfigurableHTTPProxy.get("command", ["configurable-http-proxy"]), "--redirect-port",
                       str(redirect)]
            opened = url.port or HTTPS_PORT
            if opened != c.JupyterHub.port:  # (else the proxy's own port, with no ":443" in the address)
                command += ["--redirect-to", str(opened)]
            c.ConfigurableHTTPProxy.command = command
    if access.proxies:
        c.JupyterHub.trusted_downstream_ips = list(access.proxies)
    if access.scheme != "https":
        return
    # JupyterHub hands its cookie options on to every server (JUPYTERHUB_COOKIE_OPTIONS)
    settings = dict(c.JupyterHub.get("tornado_settings", {}))
    settings["cookie_options"] = {**settings.get("cookie_options", {}), "secure": True}
    if access.hsts_s:
        settings["headers"] = {**settings.get("headers", {}),
                               "Strict-Transport-Security": f"max-age={int(access.hsts_s)}; includeSubDomains"}
    c.JupyterHub.tornado_settings = settings


def _login(c, found: Mapping[str, Any], state_dir: Path) -> None:
    """``PDL_AUTH=native``: each user's own password (pdl_spawner/accounts/authenticator.py):
    the admin's account is made from ``<state>/password``; listed users sign up with their
    one-time codes. ``pam``, ``ldap``, ``oidc``: the lab's own (:func:`_lab_login`)."""
    users = found["PDL_USERS"]
    for name in users:
        if name_problem(name):
            raise SystemExit(f"PDL_USERS: {name_problem(name)}")
    if found["PDL_AUTH"] != "native":
        _lab_login(c, found, users)
        return
    c.JupyterHub.authenticator_class = "pdl_spawner.accounts.authenticator.PDLAuthenticator"
    c.PDLAuthenticator.first_admin = users[0]
    c.PDLAuthenticator.first_admin_password_file = str(state_dir / "password")
    c.Authenticator.admin_users = set(users[:1])
    c.Authenticator.allowed_users = set(users)
    # each listed name but the admin's signs up with its own one-time code (scripts/serve
    # prints the links), so that no stranger claims it first
    SignupCodes(state_dir).ensure(users[1:])
    # NativeAuthenticator's page.html: "Change Password" for all, "Authorize Users" for admins
    c.JupyterHub.template_paths = [TEMPLATE_DIR]


def _lab_login(c, found: Mapping[str, Any], users: list[str]) -> None:
    """The lab's own logins (pdl_spawner/accounts/lab_logins.py): its passwords with PDL's
    lockout (``PDL_LOGIN_ATTEMPTS``, ``PDL_LOGIN_LOCKOUT_S``), the machine's through PAM
    (``PDL_AUTH=pam``) or a bind to the lab's directory (``ldap``: ``PDL_LDAP_URL``,
    ``PDL_LDAP_USER_DN``), or its single sign-on (``oidc``: :func:`_single_sign_on`). The
    listed users, and the members of the group ``PDL_ALLOWED_GROUP`` (a Unix group; the
    provider's with oidc), may log in; the first listed is the admin."""
    group = found.get("PDL_ALLOWED_GROUP")
    if found["PDL_AUTH"] == "pam":
        c.JupyterHub.authenticator_class = "pdl_spawner.accounts.lab_logins.PDLPAMAuthenticator"
        if group:
            c.PDLPAMAuthenticator.allowed_groups = {group}
    elif found["PDL_AUTH"] == "oidc":
        _single_sign_on(c, found, group)
    else:
        c.JupyterHub.authenticator_class = "pdl_spawner.accounts.lab_logins.PDLLDAPAuthenticator"
        if found.get("PDL_LDAP_URL"):
            directory = found["PDL_LDAP_URL"]
            c.PDLLDAPAuthenticator.server_address = directory.host
            c.PDLLDAPAuthenticator.server_port = directory.port
            c.PDLLDAPAuthenticator.tls_strategy = directory.tls_strategy
        if group:
            c.PDLLDAPAuthenticator.allowed_unix_group = group
    c.Authenticator.admin_users = set(users[:1])
    c.Authenticator.allowed_users = set(users)


def _single_sign_on(c, found: Mapping[str, Any], group: str | None) -> None:
    """``PDL_AUTH=oidc``: the lab's OpenID Connect provider (``PDL_OIDC_ISSUER``, its
    endpoints read from its discovery document once, now), this hub its client
    (``PDL_OIDC_CLIENT_ID``, the secret from ``PDL_OIDC_CLIENT_SECRET_FILE``, private to
    the hub), the browser sent back to ``<public URL>/hub/oauth_callback``; with
    ``PDL_ALLOWED_GROUP``, the members of that group of the provider's ``groups`` claim."""
    c.JupyterHub.authenticator_class = "pdl_spawner.accounts.lab_logins.PDLOIDCAuthenticator"
    section = c.PDLOIDCAuthenticator
    if found.get("PDL_OIDC_ISSUER"):
        try:
            for name, value in discover(found["PDL_OIDC_ISSUER"]).items():
                setattr(section, name, value)
        except ValueError as e:
            raise SystemExit(f"PDL_OIDC_ISSUER: {e}") from None
    if found.get("PDL_OIDC_CLIENT_SECRET_FILE"):
        section.client_secret = _private_secret(found["PDL_OIDC_CLIENT_SECRET_FILE"], "PDL_OIDC_CLIENT_SECRET_FILE")
    section.oauth_callback_url = f"{c.JupyterHub.subdomain_host}/hub/oauth_callback"
    section.scope = ["openid", "profile", "email"]
    section.login_service = "the lab's sign-on"
    if group:
        section.manage_groups = True
        section.auth_state_groups_key = "oauth_user.groups"
        section.allowed_groups = {group}


def _private_secret(path: str, variable: str) -> str:
    """The secret in the file ``path``, which only its owner may read; SystemExit (one line)
    when it is missing, empty or readable by group or others."""
    try:
        st = os.stat(path)
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise SystemExit(f"{variable}: {path} cannot be read ({e.strerror})") from None
    if st.st_mode & 0o077:
        raise SystemExit(f"{variable}: {path} is open to group or others (mode {st.st_mode & 0o777:o}): chmod 600 it")
    if not secret:
        raise SystemExit(f"{variable}: {path} is empty")
    return secret


def _lab_lockout(c) -> None:
    """The lab's logins take PDL's lockout settings (``PDL_LOGIN_ATTEMPTS``,
    ``PDL_LOGIN_LOCKOUT_S``, or their ``c.PDLAuthenticator`` lines in the admin's file)
    where ``c.GuardedLogin`` sets none (``c.PDLPAMAuthenticator``... still wins)."""
    for name in ("allowed_failed_logins", "seconds_before_next_try"):
        if name in c.PDLAuthenticator and name not in c.GuardedLogin:
            setattr(c.GuardedLogin, name, c.PDLAuthenticator[name])


def _lab_login_problem(c) -> str | None:
    """One line when the final config runs users as the lab's accounts behind PDL's own
    sign-up pages (anyone could claim a name, and so its account), or logs in to a
    directory or provider it does not name; else None."""
    login = str(c.JupyterHub.get("authenticator_class", ""))
    if "HostServer" in c and c.HostServer.get("lab_accounts") and login.endswith(".PDLAuthenticator"):
        return ("PDL_ACCOUNTS=lab runs each user as the lab's account of their name: it needs a login that proves "
                "that account, PDL_AUTH=pam, ldap or oidc (PDL_AUTH=native lets people sign up any name)")
    if login.endswith(".PDLOIDCAuthenticator"):
        section = c.PDLOIDCAuthenticator
        for trait, variable in (("authorize_url", "PDL_OIDC_ISSUER=https://sso.lab.example/realms/lab"),
                                ("client_id", "PDL_OIDC_CLIENT_ID"),
                                ("client_secret", "PDL_OIDC_CLIENT_SECRET_FILE (a file only the hub reads)")):
            if not section.get(trait):
                return f"PDL_AUTH=oidc needs {variable}"
    if login.endswith(".PDLLDAPAuthenticator"):
        section = c.PDLLDAPAuthenticator
        if not section.get("server_address") and not c.LDAPAuthenticator.get("server_address"):
            return "PDL_AUTH=ldap needs the lab's directory: PDL_LDAP_URL=ldaps://HOST[:PORT] (or ldap://, with StartTLS)"
        if not any(s.get("bind_dn_template") or s.get("lookup_dn") for s in (section, c.LDAPAuthenticator)):
            return ("PDL_AUTH=ldap needs where a person's entry is: PDL_LDAP_USER_DN, e.g. "
                    "uid={username},ou=people,dc=lab,dc=example")
    return None


def _servers(c, found: Mapping[str, Any], state_dir: Path, kind: ClusterKind, repo: Path) -> None:
    """The users' servers, whatever the kind: the spawner, their homes, what they read from the hub."""
    c.JupyterHub.spawner_class = kind.spawner.replace(":", ".")
    c.Spawner.disable_user_config = True  # a user's own Jupyter config never loads into their server
    c.Spawner.default_url = "/lab"
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 120
    # what every user's server reads from the hub's environment: the preflight checks their
    # engines skip (pdl_magics/preflight.py) and how cells split their batches (PDL_BALANCE)
    user_env = {name: found[name] for name in ("PDL_PREFLIGHT_SKIP", "PDL_BALANCE") if found[name]}
    if user_env:
        c.Spawner.environment = user_env
    if "HostServer" not in kind.sections():
        return
    # where servers run on this machine as the users' own accounts: the accounts this hub
    # made (users run only as these: never root, a system account, a lab member's own
    # login or another hub's user), and a new home starts with PDL's notebooks
    c.HostServer.accounts_record = str(state_dir / "accounts")
    skeleton = state_dir / "skel"
    (skeleton / "notebooks").mkdir(parents=True, exist_ok=True)
    for notebook in (repo / "notebooks").glob("*.ipynb"):
        (skeleton / "notebooks" / notebook.name).write_bytes(notebook.read_bytes())
    c.HostServer.skeleton_dir = str(skeleton)


def _idle_culler(c, cull_idle_s: int) -> None:
    """jupyterhub-idle-culler, as a hub service, stops whole servers without activity for
    ``cull_idle_s`` seconds (0: never); their workers are freed and their files stay."""
    if not cull_idle_s:
        return
    c.JupyterHub.services.append({
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={cull_idle_s}",
                    f"--cull-every={max(5, min(300, cull_idle_s // 4))}"],
    })
    c.JupyterHub.load_roles.append({
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    })


def _local_config(c, path: str, named: bool, load_subconfig: Callable[[str], None]) -> None:
    """The admin's own ``c.*`` settings, loaded after everything above (so that they win)
    when the file exists; the hub runs it as its own code (as root), so only a file that
    only root or the hub's user can change."""
    if os.path.lexists(path):
        problem = local_config_problem(path)
        if problem:
            raise SystemExit(f"PDL_LOCAL_CONFIG: not loaded, since the hub runs it as its own code: {problem}")
        load_subconfig(os.path.abspath(path))
    elif named:
        raise SystemExit(f"PDL_LOCAL_CONFIG names {path}, which does not exist: name the admin's config "
                         "file (c.* settings), or unset it for the default /etc/pdl/hub_config.py (loaded when present)")


def _metrics(c, kind: ClusterKind, token_file: str | None, state_dir: Path) -> None:
    """PDL's series on ``/hub/metrics`` (:mod:`pdl_spawner.hub.metrics`), read with the
    admin view's reader of the kind, and the usage book in ``state_dir``
    (:mod:`pdl_spawner.hub.usage_book`); with ``token_file``, a ``prometheus`` service
    whose token is that file's, allowed to read the metrics and nothing else."""
    from pdl_spawner.admin.view import reader
    from pdl_spawner.hub import metrics, usage_book
    from pdl_spawner.hub.usage_book import UsageBook

    book = UsageBook(state_dir / usage_book.FILE_NAME)
    metrics.register(metrics.PDLMetrics(reader({"kind": kind.name, **kind.admin_settings(c)}), kind.name, book,
                                        config=c))
    if token_file:
        token = _private_secret(token_file, "PDL_PROMETHEUS_TOKEN_FILE")
        c.JupyterHub.services.append({"name": "prometheus", "api_token": token})
        c.JupyterHub.load_roles.append({"name": "prometheus", "scopes": ["read:metrics"], "services": ["prometheus"]})


def _admin_view(c, kind: ClusterKind, port: int, state_dir: Path) -> None:
    """The admin view (pdl_spawner/admin/view.py): a JupyterHub managed service at
    /services/pdl-admin/ for admins only (scope access:services!service=pdl-admin), on
    127.0.0.1:``port``, told the kind's source settings from the final config and the
    hub's usage book in ``state_dir``; the same settings in ``state_dir``'s
    :data:`~pdl_spawner.admin.view.SETTINGS_FILE`, for ``pdl-usage``."""
    import json

    from pdl.atomic_file import write_atomic
    from pdl_spawner.admin.view import SETTINGS_FILE, SOURCE_VARIABLE, USAGE_SETTING
    from pdl_spawner.hub.usage_book import FILE_NAME

    settings = {"kind": kind.name, **kind.admin_settings(c), USAGE_SETTING: str(state_dir / FILE_NAME)}
    write_atomic(state_dir / SETTINGS_FILE, lambda f: f.write(json.dumps(settings).encode()))
    c.JupyterHub.services.append({
        "name": "pdl-admin",
        "url": f"http://127.0.0.1:{port}",
        "command": [sys.executable, "-m", "pdl_spawner.admin.view"],
        "environment": {SOURCE_VARIABLE: json.dumps(settings)},
        "oauth_no_confirm": True,
    })
