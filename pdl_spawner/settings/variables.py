"""The hub's environment variables, one table: each ``PDL_*`` variable an admin sets, how
its text is read, and where its value goes.

A :class:`Variable` either sets one configurable trait (``trait="SpawnerCore.session_limit_s"``:
its value becomes ``c.SpawnerCore.session_limit_s``, and its default is the trait's, written
there once) or is read by :mod:`pdl_spawner.settings.hub_config` itself (``trait=""``, with
its ``default`` here). :data:`VARIABLES` holds those of every kind; each cluster kind adds
its own (:attr:`pdl_spawner.kinds.ClusterKind.variables`). ``docs/admin.md``'s table is
:func:`markdown_table` of them (a test keeps the two equal).

:func:`read_variables` reads an environment against the table: the value of each variable
that is set (parsed: one line naming what is valid otherwise), and a refusal for a
``PDL_*`` variable that is not in the table, or that belongs to another kind, naming the
nearest valid one.
"""

from __future__ import annotations

import difflib
import getpass
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pdl.balance.plan import MODES as BALANCE_MODES
from pdl_spawner.hub.request_limits import DEFAULT_MAX_REQUEST_BYTES
from pdl_spawner.settings import values

#: The prefix of the hub's own variables.
PREFIX = "PDL_"


@dataclass(frozen=True)
class Variable:
    """One environment variable of the hub.

    ``name``: ``PDL_...``; ``help``: one line for the admin's guide; ``parse``: text ->
    value (:mod:`~pdl_spawner.settings.values`); ``trait``: ``"Class.name"`` the value is
    set on, or ``""``; ``default``: the value's text when unset, for a variable without a
    trait (a trait's default is the trait's own); ``shown``: the default in the guide's
    words where no value says it (e.g. "every GPU, else one CPU slot per core");
    Whether it applies to a kind: one with a trait, where the kind's spawner has that
    trait's class, or the class is the hub's own (:data:`HUB_SECTIONS`); any other,
    unless the kind declines it (:attr:`pdl_spawner.kinds.ClusterKind.declines`).
    """

    name: str
    help: str
    parse: Callable[[str, str], Any] = values.text
    trait: str = ""
    default: str = ""
    shown: str = ""

    def value(self, environ: Mapping[str, str]) -> Any:
        """The value in ``environ``, else from :attr:`default` (a variable that sets a trait
        has no value of its own when unset: None). ValueError, one line, when invalid."""
        if self.name in environ:
            return self.parse(environ[self.name], self.name)
        return self.parse(self.default, self.name) if self.default and not self.trait else None


def _default_user() -> str:
    return getpass.getuser()


#: The variables of every kind, in the order of the admin's guide.
VARIABLES: tuple[Variable, ...] = (
    Variable("PDL_STATE_DIR", "The hub's database, cookie secret, reservations, accounts record and generated "
             "password; mode 0700.", default=".pdl/hub",
             shown="`.pdl/hub` (in the folder the hub starts in; `scripts/serve`: the checkout's)"),
    Variable("PDL_USERS", "Comma-separated names that may log in; the first is the admin. More than one needs a "
             "hub run as root.", values.names, shown="the Unix user running the hub"),
    Variable("PDL_HOMES_ROOT", "Where the users' homes (mode 0700) are made, as root.",
             trait="HostServer.homes_root"),
    Variable("PDL_ACCOUNT_PREFIX", "Hub user `ann` runs as Unix account `<prefix>ann`, made by PDL (the lab's own accounts: "
             "`PDL_ACCOUNTS=lab`).", trait="HostServer.account_prefix"),
    Variable("PDL_AUTH", "How people log in: `native` (a PDL password each, sign-up pages), `pam` (the "
             "machine's own passwords), `ldap` (the lab's directory), the lab's with PDL's lockout around them, or "
             "`oidc` (the lab's single sign-on; \"The lab's own accounts\").",
             values.one_of("native", "pam", "ldap", "oidc"), default="native"),
    Variable("PDL_LDAP_URL", "With `PDL_AUTH=ldap`: the lab's directory, `ldaps://HOST[:PORT]` or "
             "`ldap://HOST[:PORT]` (StartTLS before a password is sent; plain only to 127.0.0.1).", values.ldap_url),
    Variable("PDL_LDAP_USER_DN", "With `PDL_AUTH=ldap`: a person's entry, `{username}` for the login name (e.g. "
             "`uid={username},ou=people,dc=lab,dc=example`).", values.dn_template,
             trait="PDLLDAPAuthenticator.bind_dn_template"),
    Variable("PDL_OIDC_ISSUER", "With `PDL_AUTH=oidc`: the OpenID Connect provider's issuer URL, `https://...` "
             "(its endpoints are read from its discovery document when the hub starts).", values.oidc_issuer),
    Variable("PDL_OIDC_CLIENT_ID", "With `PDL_AUTH=oidc`: the hub's client id at the provider.",
             trait="PDLOIDCAuthenticator.client_id"),
    Variable("PDL_OIDC_CLIENT_SECRET_FILE", "With `PDL_AUTH=oidc`: a file holding the client's secret, readable "
             "by the hub's user only (mode 0600)."),
    Variable("PDL_OIDC_USERNAME_CLAIM", "With `PDL_AUTH=oidc`: the claim whose value is the hub user's name.",
             trait="PDLOIDCAuthenticator.username_claim"),
    Variable("PDL_ACCOUNTS", "Whose Unix accounts servers run as: `pdl` (`<prefix><name>`, made by PDL) or `lab` "
             "(the existing account of the same name; with `PDL_AUTH=pam`, `ldap` or `oidc`).", values.lab_accounts,
             trait="HostServer.lab_accounts", shown="`pdl`"),
    Variable("PDL_ACCOUNT_UID_MIN", "With `PDL_ACCOUNTS=lab`: the lowest uid a user's account may have (0: the "
             "machine's `UID_MIN`).", values.whole_number, trait="HostServer.lab_uid_min"),
    Variable("PDL_ALLOWED_GROUP", "With `PDL_ACCOUNTS=lab`: only members of this Unix group may log in and run "
             "here (empty: any ordinary account).", trait="HostServer.lab_group"),
    Variable("PDL_LOCAL_CONFIG", "The admin's own config file of `c.*` settings, loaded when it exists (below). "
             "Named explicitly, it must exist.", default="/etc/pdl/hub_config.py"),
    Variable("PDL_PUBLIC_URL", "The URL browsers open; each user's server is at `<name>.<host>` (\"One origin "
             "per user\").", shown="`http://localhost:<PDL_HUB_PORT>`"),
    Variable("PDL_HUB_IP", "Where the hub's public port listens: an address of this machine, `0.0.0.0` for every "
             "interface (\"Opening the hub to the lab\").", values.address,
             shown="`127.0.0.1` (this machine only; on Swarm every interface, or `PDL_HUB_CONNECT_IP` where this "
             "host's name does not resolve)"),
    Variable("PDL_HUB_PORT", "The hub's public port (the proxy's), on `PDL_HUB_IP`.",
             values.port, trait="JupyterHub.port", shown="`8000` (with `PDL_TLS_CERT`: `PDL_PUBLIC_URL`'s port, 443)"),
    Variable("PDL_TLS_CERT", "The hub serves HTTPS itself with this certificate (PEM, the chain after it), which "
             "must name the hub's host and its wildcard, `hub.lab.example` and `*.hub.lab.example`."),
    Variable("PDL_TLS_KEY", "The private key of `PDL_TLS_CERT` (PEM, unencrypted, mode 0600)."),
    Variable("PDL_HTTP_PORT", "With `PDL_TLS_CERT`: the port whose plain HTTP is redirected to HTTPS (0: none).",
             values.whole_number, shown="`80`"),
    Variable("PDL_TLS_PROXY", "The addresses (comma-separated) of a reverse proxy in front of the hub that serves "
             "HTTPS for it; the hub then serves plain HTTP to it, and takes a client's address from the proxy's "
             "`X-Forwarded-For`.", values.addresses),
    Variable("PDL_HSTS_S", "Seconds browsers are told to open the hub and its users' servers over HTTPS only "
             "(`Strict-Transport-Security`, with `includeSubDomains`; 0: not sent).", values.seconds, default="0"),
    Variable("PDL_HUB_INTERNAL_PORT", "The hub's own API, which servers call.", values.port,
             trait="JupyterHub.hub_port"),
    Variable("PDL_PROXY_API_PORT", "configurable-http-proxy's API, on 127.0.0.1.", values.port, default="8001"),
    Variable("PDL_ADMIN_VIEW_PORT", "The admin view (`pdl-admin` service), on 127.0.0.1 (\"Admin view\").",
             values.port, default="8002"),
    Variable("PDL_PROMETHEUS_TOKEN_FILE", "A file holding the token Prometheus scrapes `/hub/metrics` with, "
             "readable by the hub's user only (mode 0600): the service `prometheus`, whose only scope is "
             "`read:metrics` (\"Metrics\")."),
    Variable("PDL_PORT_RANGE", "`LOW-HIGH`, both included: the ports the users' servers get, with their ipyparallel "
             "controllers' (19 in a row each on one machine and Slurm's login node).", values.port_range, trait="SpawnerCore.port_range"),
    Variable("PDL_KEEP_SERVERS", "`1`: servers keep running across a hub restart; `0`: they stop, and free "
             "their workers, when the hub stops.", values.flag, default="1"),
    Variable("PDL_MAX_REQUEST_BYTES", "The largest request body the hub reads; a larger one is refused with 400.",
             values.positive_number, default=str(DEFAULT_MAX_REQUEST_BYTES)),
    Variable("PDL_LOGIN_ATTEMPTS", "Wrong passwords in a row that lock a name (0: never).", values.whole_number,
             trait="PDLAuthenticator.allowed_failed_logins"),
    Variable("PDL_LOGIN_LOCKOUT_S", "Seconds a locked name waits after its last failure.", values.whole_number,
             trait="PDLAuthenticator.seconds_before_next_try"),
    Variable("PDL_PENDING_SIGNUPS", "Sign-ups of unlisted names that may wait for approval at once.",
             values.whole_number, trait="PDLAuthenticator.pending_signups_at_most"),
    Variable("PDL_SIGNUPS_PER_ADDRESS", "Sign-ups without a one-time code one client address may make in 10 minutes.",
             values.whole_number, trait="PDLAuthenticator.signups_per_address"),
    Variable("PDL_SPAWNER", "The cluster kind: `local` (this machine), `swarm` (\"A GPU cluster: Docker Swarm\") "
             "or `slurm` (\"A Slurm cluster\").", default="local"),
    Variable("PDL_DEFAULT_WORKERS", "The workers (GPUs, or CPU slots) a spawn form offers first, and a request "
             "naming none gets.", values.whole_number, trait="SpawnerCore.default_workers",
             shown="`1` (`3` on the embedded default)"),
    Variable("PDL_ENGINE_IDLE_TIMEOUT", "Seconds without a task after which a user's engines stop and give their "
             "workers back (0: never; \"The queue and idle reclaim\").", values.whole_number,
             trait="SpawnerCore.engine_idle_timeout"),
    Variable("PDL_SESSION_LIMIT_S", "The longest session (one grant of workers) in seconds (0: none; \"A "
             "session's time\"); on Slurm the job's time limit is the session's.", values.seconds,
             trait="SpawnerCore.session_limit_s"),
    Variable("PDL_SESSION_MAX_S", "The longest a session may be extended to, in seconds from its start, by its "
             "user's \"Extend\" (each time by `PDL_SESSION_LIMIT_S`, while nobody waits in the queue; 0: no "
             "extension).", values.seconds, trait="SpawnerCore.session_max_s"),
    Variable("PDL_SESSION_WARN_S", "Seconds before a session's end from which its user is warned, in the Cluster "
             "panel and by each cell.", values.seconds, trait="SpawnerCore.session_warning_s"),
    Variable("PDL_GPU_IDLE_FLAG_S", "Seconds at 0 % use of every GPU a server holds (read with `nvidia-smi` by "
             "the hub) after which it is flagged in its panel, its cells and the admin view (0: no watch; \"GPUs "
             "held idle\").", values.seconds, trait="SpawnerCore.gpu_idle_flag_s"),
    Variable("PDL_GPU_IDLE_RELEASE_S", "Seconds at 0 % GPU use after which the engines are released as idle "
             "ones are (0: flag only); the user is warned from the flag on.", values.seconds,
             trait="SpawnerCore.gpu_idle_release_s"),
    Variable("PDL_CULL_IDLE_S", "Seconds without activity after which a whole server is stopped (0: never).",
             values.whole_number, default="86400"),
    Variable("PDL_PREFLIGHT_SKIP", "Preflight checks every user's engines skip, comma-separated, e.g. `gpu` "
             "(\"Preflight\")."),
    Variable("PDL_BALANCE", "How every user's cells split each step's batch where the cell says neither "
             "`--balance` nor `--no-balance`: `auto` (to the ranks' speeds where they differ by over 10 % and "
             "beyond the machine's noise), `on`, or `off` (evenly: a run then depends on its seed only, not on "
             "the machine's load). A user sets it for themselves with `c.DistributedMagics.balance`.",
             values.one_of(*BALANCE_MODES),
             shown="`auto`"),
)


#: The configurable classes of the hub itself, whose traits apply whatever the kind.
HUB_SECTIONS = frozenset({"JupyterHub", "PDLAuthenticator", "GuardedLogin", "PDLPAMAuthenticator",
                          "PDLLDAPAuthenticator", "PDLOIDCAuthenticator", "ConfigurableHTTPProxy", "Spawner"})


def read_variables(environ: Mapping[str, str], kind, others: Iterable = ()) -> dict[str, Any]:
    """The value of each variable of :data:`VARIABLES` and of ``kind``'s in ``environ``
    (or its default), by name; ``kind`` and ``others`` (the other registered kinds) are
    :class:`pdl_spawner.kinds.ClusterKind`.

    ValueError, one line, for an invalid value, for a ``PDL_*`` variable that does not
    apply to ``kind`` (another kind's, or one it declines, saying whose or why), and for
    one of no kind at all (naming the nearest valid one).
    """
    sections = set(kind.sections()) | HUB_SECTIONS
    table = {v.name: v for v in (*VARIABLES, *kind.variables)}
    elsewhere: dict[str, list[str]] = {}
    for other in others:
        for v in other.variables:
            elsewhere.setdefault(v.name, []).append(other.name)
    for name in sorted(n for n in environ if n.startswith(PREFIX)):
        variable = table.get(name)
        if variable and name in kind.declines:
            raise ValueError(f"{name} does not apply to PDL_SPAWNER={kind.name}: {kind.declines[name]}; unset it")
        if variable and variable.trait and variable.trait.partition(".")[0] not in sections:
            raise ValueError(f"{name} does not apply to PDL_SPAWNER={kind.name} (its spawner has no "
                             f"{variable.trait}): unset it")
        if variable:
            continue
        if name in elsewhere:
            raise ValueError(f"{name} applies to PDL_SPAWNER={' or '.join(elsewhere[name])} only, and this hub's "
                             f"is {kind.name}: unset it")
        near = difflib.get_close_matches(name, [*table, *elsewhere], n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}?" if near else 'docs/admin.md, "Every setting, in one place", lists them'
        raise ValueError(f"{name} is not a setting of PDL's hub: {hint}")
    found = {name: variable.value(environ) for name, variable in table.items()}
    if not found.get("PDL_USERS"):
        found["PDL_USERS"] = [_default_user()]
    return found


def shown_default(variable: Variable, trait_default: Callable[[str], Any]) -> str:
    """The default as the admin's guide shows it: :attr:`Variable.shown`, else the trait's
    (``trait_default(trait)``), else :attr:`Variable.default`, else "none"."""
    if variable.shown:
        return variable.shown
    if variable.trait:
        value = trait_default(variable.trait)
        if value in ("", None, []):
            return "none"
        if isinstance(value, tuple):
            return f"`{'-'.join(str(v) for v in value)}`"
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"
    return f"`{variable.default}`" if variable.default else "none"


def markdown_table(variables: Iterable[tuple[Variable, str]], trait_default: Callable[[str], Any]) -> str:
    """The admin guide's table of ``variables``, each with the kind it belongs to ("": every
    kind): name, default, what it does (with its ``c.*`` setting)."""
    rows = ["| Variable | Default | What it does |", "|---|---|---|"]
    for v, kind in variables:
        setting = f" `c.{v.trait}`." if v.trait else ""
        where = f"`PDL_SPAWNER={kind}`: " if kind else ""
        rows.append(f"| `{v.name}` | {shown_default(v, trait_default)} | {where}{v.help}{setting} |")
    return "\n".join(rows)
