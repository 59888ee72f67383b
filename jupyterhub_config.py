"""JupyterHub configuration for PDL's embedded default: one machine, local engines.

Start with ``jupyterhub -f jupyterhub_config.py`` (``scripts/serve`` does it all).
Environment variables tune it without editing this file:

- ``PDL_STATE_DIR``: where the hub keeps its database, cookie secret,
  reservations and generated password (default ``./.pdl/hub``; mode 0700, the hub's alone);
- ``PDL_USERS``: comma-separated user names allowed to log in (default: the
  Unix user running the hub); the first one is the admin. More than one needs a hub
  running as root: each hub user's server and engines then run as their own Unix
  account, ``pdl-<name>``, made on the first spawn, with a home of mode 0700 in
  ``PDL_HOMES_ROOT`` (default ``/home``); ``PDL_ACCOUNT_PREFIX`` changes ``pdl-``;
- ``PDL_HUB_PORT``: port on 127.0.0.1 (default 8000); ``PDL_HUB_INTERNAL_PORT``
  and ``PDL_PROXY_API_PORT`` move the hub's own API (8081) and the proxy's (8001);
- ``PDL_PUBLIC_URL``: the URL browsers open, ``http(s)://NAME[:PORT]`` (default
  ``http://localhost:<PDL_HUB_PORT>``); each user's server is at ``<name>.NAME``, an
  origin of its own, so a lab's name needs a wildcard DNS entry (docs/admin.md, "One
  origin per user");
- ``PDL_KEEP_SERVERS``: ``1`` (default) keeps users' servers running across a hub
  restart; ``0`` stops them, and frees their slots, when the hub stops;
- ``PDL_SPAWNER``: ``local`` (default: engines are processes on this machine) or
  ``swarm`` (a Docker Swarm mini-cluster; then ``PDL_HUB_CONNECT_IP``, this node's
  address as the other nodes reach it, is required, and ``PDL_NODES`` (the swarm
  nodes whose GPUs to use, e.g. ``gpu1,gpu2,gpu3``; default: all), ``PDL_NOTEBOOK_IMAGE``,
  ``PDL_HUB_IP`` (where the proxy listens; default: every interface, or
  ``PDL_HUB_CONNECT_IP`` where this host's name does not resolve) and
  ``PDL_DEFAULT_WORKERS`` apply); storage there:
  ``PDL_HOME_STORAGE`` (``volume``, the default: a Docker volume ``pdl-home-<user>`` per
  node, or ``path``: a folder every node mounts from shared storage), ``PDL_HOME_PATH``
  (that folder, e.g. ``/srv/pdl/home/{username}``), and the read-only dataset at /data:
  ``PDL_DATA_PATH`` (a folder on every node, e.g. ``/srv/pdl/data``) or ``PDL_DATA_NFS``
  (``addr:/export``, e.g. ``10.0.0.5:/export/data``), not both (docs/admin.md, "Storage");
- ``PDL_SPAWNER=slurm``: the lab's Slurm cluster, with this machine as a login node
  (the hub must run as root): ``PDL_CONTROLLER_IP`` (required: this machine's address
  as the compute nodes reach it), ``PDL_SLURM_PARTITION`` (default: Slurm's default
  partition), ``PDL_SLURM_ACCOUNT`` (a Slurm account PDL adds each user to, whose QOS
  and limits then apply; default: none, the users' own associations),
  ``PDL_DEFAULT_WORKERS`` and ``PDL_SLURM_SERVER`` (where each user's server runs:
  ``login``, the default, on this machine, or ``allocation``, a step of the user's job;
  the hub's API then listens on ``PDL_CONTROLLER_IP``); Slurm's client commands and
  ``SLURM_CONF`` as the login node has them (docs/admin.md, "A Slurm cluster");
- ``PDL_ENGINE_IDLE_TIMEOUT``: seconds without a task after which a user's engines
  are stopped and their slots or GPUs released (default 0: never); the server and its files stay;
- ``PDL_SESSION_LIMIT_S``: the longest session in seconds, on the embedded default and
  Docker Swarm (default 0: none; on Slurm the job's time limit is the session's): then
  the engines are released as idle ones are and the next cell asks for workers again;
  ``PDL_SESSION_WARN_S``: how long before a session's end its user is warned (default 600);
  ``PDL_SESSION_MAX_S``: how long a session may be extended to from its start, by its
  user's Extend in the Cluster panel (default 0: no extension);
- ``PDL_GPU_IDLE_FLAG_S`` / ``PDL_GPU_IDLE_RELEASE_S``: seconds
  at 0 % GPU use after which a server is flagged (panel, admin view) / its engines are
  released as idle ones are (default 0: never);
- ``PDL_CULL_IDLE_S``: seconds without activity after which jupyterhub-idle-culler
  stops a whole server (default 86400; 0: never);
- ``PDL_POOL``: slots to share, e.g. ``gpu:0,gpu:1`` or ``cpu:0,cpu:1,cpu:2``
  (default: every GPU, else one CPU slot per core);
- ``PDL_PREFLIGHT_SKIP``: preflight checks to skip on every user's engines, e.g. ``gpu``
  on a test cluster whose declared GPUs torch cannot see (docs/admin.md, "Preflight").
- ``PDL_BALANCE``: how every user's cells split each step's batch where the cell does
  not say (``auto``, the default: to the ranks' speeds where they differ; ``on``; ``off``:
  evenly, so a run depends on its seed only).

Login is jupyterhub-nativeauthenticator (``pdl_spawner.core.accounts.PDLAuthenticator``):
every user has their own password, kept as a bcrypt hash in the hub's database. The
admin's account is made at first start with a random password, stored with mode 0600
in ``$PDL_STATE_DIR/password`` (``scripts/serve`` prints it). As root, everyone else
signs up at ``/hub/signup`` with a password of their own (at least 8 characters, not a
common one): names in ``PDL_USERS`` through their one-time sign-up links
(``$PDL_STATE_DIR/signup-codes``, printed by ``scripts/serve``), approved at once;
others wait for the admin at ``/hub/authorize``; without root, signup is off and only the admin logs in. Names are a
lowercase letter then at most 19 of ``a-z0-9_-``. Wrong passwords lock a name:

- ``PDL_LOGIN_ATTEMPTS``: wrong passwords in a row that lock a name (default 5; 0: never);
- ``PDL_LOGIN_LOCKOUT_S``: seconds a locked name waits after its last failure (default 60);
- ``PDL_PENDING_SIGNUPS``: sign-ups of unlisted names that may wait for approval (default 20).
- ``PDL_SIGNUPS_PER_ADDRESS``: sign-ups of unlisted names one client address may make in
  10 minutes (default 10).

``PDL_MAX_REQUEST_BYTES``: the largest request body the hub reads (default 1 MiB); a
larger one is refused with 400 before it is read.

Ports: ``PDL_ADMIN_VIEW_PORT`` (the admin view on 127.0.0.1, default 8002) and
``PDL_PORT_RANGE``, the users' servers' ports (``LOW-HIGH``, default ``20000-32000``).

Any other setting (``c.PDLSlurmSpawner.time_limit = 480``, ...) goes in the admin's own
config file, ``/etc/pdl/hub_config.py`` or ``PDL_LOCAL_CONFIG``, which this file loads
when it exists (its settings win), if only root or the hub's user can change it: else
the hub does not start and says why. docs/admin.md, "Every setting, in one place",
lists every variable with its default.
"""

import getpass
import os
import sys
from pathlib import Path

from pdl.balance.plan import MODES as BALANCE_MODES
from pdl_spawner.core.account_limits import protect_hub
from pdl_spawner.core.accounts import TEMPLATE_DIR, name_problem
from pdl_spawner.core.credentials import SignupCodes
from pdl_spawner.core.hub_settings import local_config_problem, port_range, seconds
from pdl_spawner.core.public_url import default_public_url, public_url_problem
from pdl_spawner.core.request_limits import DEFAULT_MAX_REQUEST_BYTES, limit_request_bodies

c = get_config()  # noqa: F821 - provided by JupyterHub

# Everything the hub writes (its database, cookie secret, passwords, pid files) is
# created readable by this user alone, with no window in which it is not.
os.umask(0o077)

state_dir = Path(os.environ.get("PDL_STATE_DIR", ".pdl/hub")).resolve()
state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
state_dir.chmod(0o700)  # also when it was made before, by hand: the hub's secrets live here


users = [u.strip() for u in os.environ.get("PDL_USERS", getpass.getuser()).split(",") if u.strip()]
_embedded = os.environ.get("PDL_SPAWNER", "local") == "local"

# Users are separated by Unix accounts, which only a hub running as root can make: without
# root every server would run as the hub's own user, able to read and signal the others'.
if _embedded and os.geteuid() != 0 and len(users) > 1:
    raise SystemExit(f"PDL_USERS lists {len(users)} users, but the hub is not root, so their servers could not "
                     "be kept apart: start it as root (each user then gets their own Unix account), "
                     "or list one user")

# The hub, and the proxy and admin view it starts, are the last the OOM killer picks: the
# users' processes (marked by the spawner) and their memory limits go first. Where the hub
# may not lower its score, the spawner logs so at its first start.
if os.geteuid() == 0:
    protect_hub()

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ.get("PDL_HUB_PORT", "8000"))
# Each user's server is a web origin of its own, <name>.<host> beside the hub at <host>
# (pdl_spawner/core/public_url.py): a page a user serves cannot act as whoever opens it.
_public_url = os.environ.get("PDL_PUBLIC_URL", "").strip() or default_public_url(c.JupyterHub.port)
_public_url_problem = public_url_problem(_public_url)
if _public_url_problem:
    raise SystemExit(_public_url_problem)
c.JupyterHub.subdomain_host = _public_url.rstrip("/")
# a user's own Jupyter config (~/.jupyter, ~/.local/share/jupyter) never loads into their server
c.Spawner.disable_user_config = True
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("PDL_HUB_INTERNAL_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('PDL_PROXY_API_PORT', '8001')}"
# configurable-http-proxy as installed by scripts/setup, when it is there
_proxy = Path(__file__).resolve().parent / ".pdl/node/node_modules/.bin/configurable-http-proxy"
if _proxy.exists():
    c.ConfigurableHTTPProxy.command = [str(_proxy)]
c.JupyterHub.db_url = f"sqlite:///{state_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state_dir / "jupyterhub.pid")
# By default servers and their engines keep running across hub restarts; the
# reservation ledger and spawner state let the restarted hub take them back.
# PDL_KEEP_SERVERS=0 stops every server (releasing its slots) when the hub stops.
c.JupyterHub.cleanup_servers = os.environ.get("PDL_KEEP_SERVERS", "1") == "0"
c.ConfigurableHTTPProxy.pid_file = str(state_dir / "proxy.pid")

# Each user's own password (pdl_spawner/core/accounts.py): the admin's account is made from
# $PDL_STATE_DIR/password; listed users sign up with their one-time codes and are approved at once, others wait.
for _name in users:
    if name_problem(_name):
        raise SystemExit(f"PDL_USERS: {name_problem(_name)}")
_max_body = os.environ.get("PDL_MAX_REQUEST_BYTES", str(DEFAULT_MAX_REQUEST_BYTES))
if not _max_body.isdigit() or int(_max_body) == 0:
    raise SystemExit(f"PDL_MAX_REQUEST_BYTES must be a positive number of bytes, got {_max_body[:40]!r}")
limit_request_bodies(int(_max_body))
c.JupyterHub.authenticator_class = "pdl_spawner.core.accounts.PDLAuthenticator"
c.PDLAuthenticator.first_admin = users[0]
c.PDLAuthenticator.first_admin_password_file = str(state_dir / "password")
c.PDLAuthenticator.allowed_failed_logins = int(os.environ.get("PDL_LOGIN_ATTEMPTS", "5"))
c.PDLAuthenticator.seconds_before_next_try = int(os.environ.get("PDL_LOGIN_LOCKOUT_S", "60"))
c.PDLAuthenticator.pending_signups_at_most = int(os.environ.get("PDL_PENDING_SIGNUPS", "20"))
c.PDLAuthenticator.signups_per_address = int(os.environ.get("PDL_SIGNUPS_PER_ADDRESS", "10"))
if os.environ.get("PDL_SPAWNER", "local") == "swarm":
    c.PDLAuthenticator.enable_signup = True  # servers are containers: kept apart without root too
c.Authenticator.admin_users = set(users[:1])
c.Authenticator.allowed_users = set(users)
# each listed name but the admin's signs up with its own one-time code (scripts/serve
# prints the links; the file is $PDL_STATE_DIR/signup-codes), so no stranger claims it first
SignupCodes(state_dir).ensure(users[1:])
# NativeAuthenticator's page.html: "Change Password" for all, "Authorize Users" for admins
c.JupyterHub.template_paths = [TEMPLATE_DIR]

c.JupyterHub.spawner_class = "pdl-local"
c.PDLLocalSpawner.reservations_db = str(state_dir / "reservations.sqlite")
# HostServer (pdl_spawner/core/host_server.py): the server part of the local and Slurm
# kinds. The Unix accounts this hub made: users run only as these (never root, a system
# account, a lab member's own login or another hub's user)
c.HostServer.accounts_record = str(state_dir / "accounts")
# As root, every hub user runs as their own account (pdl-<name>, home /home/pdl-<name>,
# mode 0700), made on the first spawn; a new home starts with PDL's notebooks.
_skeleton = state_dir / "skel"
(_skeleton / "notebooks").mkdir(parents=True, exist_ok=True)
for _notebook in (Path(__file__).resolve().parent / "notebooks").glob("*.ipynb"):
    (_skeleton / "notebooks" / _notebook.name).write_bytes(_notebook.read_bytes())
c.HostServer.skeleton_dir = str(_skeleton)
if os.environ.get("PDL_HOMES_ROOT"):
    c.HostServer.homes_root = os.environ["PDL_HOMES_ROOT"]
if os.environ.get("PDL_ACCOUNT_PREFIX"):  # hub user ann runs as <prefix>ann (default pdl-)
    c.HostServer.account_prefix = os.environ["PDL_ACCOUNT_PREFIX"]
# the ports the users' servers get, one each (and on Swarm their controllers' too)
if os.environ.get("PDL_PORT_RANGE"):
    try:
        c.HostServer.port_range = c.PDLSwarmSpawner.port_range = port_range(os.environ["PDL_PORT_RANGE"])
    except ValueError as e:
        raise SystemExit(str(e)) from None
c.PDLLocalSpawner.default_workers = 3
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
# idle engines give their slots back after this many seconds (0: never); the server stays
c.PDLLocalSpawner.engine_idle_timeout = int(os.environ.get("PDL_ENGINE_IDLE_TIMEOUT", "0"))
# the longest session, one grant of workers, in seconds (0: none; on Slurm the job's time
# limit is the session's), and how long before any session's end its user is warned
try:
    _session_limit_s = seconds(os.environ.get("PDL_SESSION_LIMIT_S", "0"), "PDL_SESSION_LIMIT_S")
    _session_warn_s = seconds(os.environ.get("PDL_SESSION_WARN_S", "600"), "PDL_SESSION_WARN_S")
    _session_max_s = seconds(os.environ.get("PDL_SESSION_MAX_S", "0"), "PDL_SESSION_MAX_S")
    # GPUs held idle (0 % use, read with nvidia-smi: on this machine, on a Slurm job's nodes,
    # by the hub's reader service on a swarm): flagged after this long, released after that long (0: never)
    c.PDLLocalSpawner.gpu_idle_flag_s = seconds(os.environ.get("PDL_GPU_IDLE_FLAG_S", "0"), "PDL_GPU_IDLE_FLAG_S")
    c.PDLLocalSpawner.gpu_idle_release_s = seconds(os.environ.get("PDL_GPU_IDLE_RELEASE_S", "0"),
                                                   "PDL_GPU_IDLE_RELEASE_S")
except ValueError as e:
    raise SystemExit(f"jupyterhub_config.py: {e}") from None
c.PDLLocalSpawner.session_limit_s = _session_limit_s
c.PDLLocalSpawner.session_max_s = _session_max_s
c.PDLLocalSpawner.session_warning_s = _session_warn_s
if os.environ.get("PDL_POOL"):
    c.PDLLocalSpawner.pool = [s.strip() for s in os.environ["PDL_POOL"].split(",") if s.strip()]

# What every user's servers read from the hub's environment: the preflight checks their
# engines skip (e.g. "gpu" on a test cluster whose declared GPUs torch cannot see;
# pdl_magics/preflight.py, SKIPPABLE) and how cells split their batches (PDL_BALANCE:
# DistributedMagics.balance).
if os.environ.get("PDL_BALANCE", "auto") not in BALANCE_MODES:
    raise SystemExit(f"PDL_BALANCE must be one of {', '.join(BALANCE_MODES)}, got {os.environ['PDL_BALANCE'][:40]!r}")
_user_env = {"PDL_PREFLIGHT_SKIP": os.environ.get("PDL_PREFLIGHT_SKIP", ""),
             "PDL_BALANCE": os.environ.get("PDL_BALANCE", "")}
_user_env = {name: value for name, value in _user_env.items() if value}
if _user_env:
    c.Spawner.environment = _user_env

if os.environ.get("PDL_SPAWNER", "local") == "swarm":
    # The mini-cluster: users' servers and engines run as Docker Swarm services, one
    # engine per GPU that the nodes declare (docs/admin.md). The hub talks to the
    # manager's Docker socket and must be reachable from every node.
    c.JupyterHub.spawner_class = "pdl-swarm"
    from pdl_spawner.swarm.hub_address import proxy_ip

    if not os.environ.get("PDL_HUB_CONNECT_IP"):
        raise SystemExit("jupyterhub_config.py: PDL_SPAWNER=swarm needs PDL_HUB_CONNECT_IP, this node's address "
                         "as the other nodes reach it (e.g. -e PDL_HUB_CONNECT_IP=10.0.0.5)")
    try:  # every interface, unless this host's name does not resolve (then the manager's address)
        c.JupyterHub.ip = proxy_ip(os.environ.get("PDL_HUB_IP"), os.environ["PDL_HUB_CONNECT_IP"])
    except ValueError as e:
        raise SystemExit(f"jupyterhub_config.py: {e}") from None
    c.JupyterHub.hub_ip = "0.0.0.0"
    c.JupyterHub.hub_connect_ip = os.environ["PDL_HUB_CONNECT_IP"]  # this node's address
    c.PDLSwarmSpawner.image = os.environ.get("PDL_NOTEBOOK_IMAGE", "pdl-notebook:latest")
    c.PDLSwarmSpawner.client_kwargs = {"base_url": os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")}
    # a worker on Swarm is one GPU; PDL_DEFAULT_GPUS is its older name
    c.PDLSwarmSpawner.default_workers = int(os.environ.get("PDL_DEFAULT_WORKERS", os.environ.get("PDL_DEFAULT_GPUS", "1")))
    c.PDLSwarmSpawner.state_db = str(state_dir / "swarm.sqlite")  # the queue and the reclaim log
    c.PDLSwarmSpawner.engine_idle_timeout = c.PDLLocalSpawner.engine_idle_timeout
    c.PDLSwarmSpawner.session_limit_s = _session_limit_s
    c.PDLSwarmSpawner.session_max_s = _session_max_s
    c.PDLSwarmSpawner.session_warning_s = _session_warn_s
    c.PDLSwarmSpawner.gpu_idle_flag_s = c.PDLLocalSpawner.gpu_idle_flag_s
    c.PDLSwarmSpawner.gpu_idle_release_s = c.PDLLocalSpawner.gpu_idle_release_s
    c.PDLSwarmSpawner.nodes = [n.strip() for n in os.environ.get("PDL_NODES", "").split(",") if n.strip()]
    c.PDLSwarmSpawner.home_storage = os.environ.get("PDL_HOME_STORAGE", "volume")
    if os.environ.get("PDL_HOME_PATH"):
        c.PDLSwarmSpawner.home_path_template = os.environ["PDL_HOME_PATH"]
    if os.environ.get("PDL_DATA_PATH") and os.environ.get("PDL_DATA_NFS"):
        raise SystemExit("set PDL_DATA_PATH or PDL_DATA_NFS, not both")
    if os.environ.get("PDL_DATA_PATH"):
        c.PDLSwarmSpawner.data_storage = {"kind": "path", "source": os.environ["PDL_DATA_PATH"]}
    elif os.environ.get("PDL_DATA_NFS"):
        addr, _, export = os.environ["PDL_DATA_NFS"].partition(":")
        c.PDLSwarmSpawner.data_storage = {"kind": "nfs", "addr": addr, "export": export}
elif os.environ.get("PDL_SPAWNER", "local") == "slurm":
    # The lab's Slurm cluster (docs/admin.md, "A Slurm cluster"): this machine is a login
    # node; each server runs here as its user's Unix account, its GPUs are a Slurm job
    # submitted as that account, its engines the job's steps on the compute nodes.
    if os.geteuid() != 0:
        raise SystemExit("jupyterhub_config.py: PDL_SPAWNER=slurm needs the hub to run as root (it submits each "
                         "user's job as their own Unix account)")
    if not os.environ.get("PDL_CONTROLLER_IP"):
        raise SystemExit("jupyterhub_config.py: PDL_SPAWNER=slurm needs PDL_CONTROLLER_IP, this machine's address "
                         "as the compute nodes reach it (e.g. PDL_CONTROLLER_IP=10.0.0.5)")
    c.JupyterHub.spawner_class = "pdl-slurm"
    c.PDLSlurmSpawner.controller_ip = os.environ["PDL_CONTROLLER_IP"]
    c.PDLSlurmSpawner.partition = os.environ.get("PDL_SLURM_PARTITION", "")
    # the Slurm account PDL adds each user to (its QOS and limits then apply); "": their own
    c.PDLSlurmSpawner.slurm_account = os.environ.get("PDL_SLURM_ACCOUNT", "")
    c.PDLSlurmSpawner.default_workers = int(os.environ.get("PDL_DEFAULT_WORKERS", "1"))
    c.PDLSlurmSpawner.engine_idle_timeout = c.PDLLocalSpawner.engine_idle_timeout
    c.PDLSlurmSpawner.session_warning_s = _session_warn_s  # the session is the job's time limit
    c.PDLSlurmSpawner.gpu_idle_flag_s = c.PDLLocalSpawner.gpu_idle_flag_s
    c.PDLSlurmSpawner.gpu_idle_release_s = c.PDLLocalSpawner.gpu_idle_release_s
    c.PDLSlurmSpawner.flags_db = str(state_dir / "slurm-flags.sqlite")  # flags on GPUs held idle, for the admin view
    # where each server runs: "login" (here) or "allocation" (a step of the user's job)
    _server_placement = os.environ.get("PDL_SLURM_SERVER", "login")
    if _server_placement not in ("login", "allocation"):
        raise SystemExit(f"jupyterhub_config.py: PDL_SLURM_SERVER must be 'login' or 'allocation', got "
                         f"{_server_placement!r}")
    c.PDLSlurmSpawner.server_placement = _server_placement
    if _server_placement == "allocation":  # the servers on the compute nodes reach the hub's API here
        c.JupyterHub.hub_ip = os.environ["PDL_CONTROLLER_IP"]
        c.JupyterHub.hub_connect_ip = os.environ["PDL_CONTROLLER_IP"]
elif os.environ.get("PDL_SPAWNER", "local") != "local":
    raise SystemExit(f"PDL_SPAWNER must be 'local', 'swarm' or 'slurm', got {os.environ['PDL_SPAWNER']!r}")

# -- Idle servers ------------------------------------------------------------------------
# jupyterhub-idle-culler, as a hub service, stops whole servers that had no activity for
# PDL_CULL_IDLE_S seconds (default 86400; 0: never); their slots or GPUs are freed and the
# users' files stay. Idle engines alone are released sooner: PDL_ENGINE_IDLE_TIMEOUT.
_cull_idle_s = int(os.environ.get("PDL_CULL_IDLE_S", "86400"))
if _cull_idle_s:
    c.JupyterHub.services.append({
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={_cull_idle_s}",
                    f"--cull-every={max(5, min(300, _cull_idle_s // 4))}"],
    })
    c.JupyterHub.load_roles.append({
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    })

# -- The admin's own settings ----------------------------------------------------------
# Any c.* setting, in a file of the admin's own (default /etc/pdl/hub_config.py; another:
# PDL_LOCAL_CONFIG), loaded when it exists: after everything above, so that its settings
# win, and before the admin view, which passes the final ones on. The hub runs it as its
# own code (as root): it must be a file only root, or the hub's user, can change.
_local_config = os.environ.get("PDL_LOCAL_CONFIG", "").strip() or "/etc/pdl/hub_config.py"
if os.path.lexists(_local_config):
    _local_config_problem = local_config_problem(_local_config)
    if _local_config_problem:
        raise SystemExit(f"PDL_LOCAL_CONFIG: not loaded, since the hub runs it as its own code: {_local_config_problem}")
    load_subconfig(os.path.abspath(_local_config))  # noqa: F821 - provided by the config loader
elif os.environ.get("PDL_LOCAL_CONFIG", "").strip():
    raise SystemExit(f"PDL_LOCAL_CONFIG names {_local_config}, which does not exist: name the admin's config "
                     "file (c.* settings), or unset it for the default /etc/pdl/hub_config.py (loaded when present)")

# -- Admin view (pdl_spawner/admin_view.py) ---------------------------------------------
# A JupyterHub managed service at /services/pdl-admin/ (and .../api/status as JSON): who
# holds which slot or GPU (on which node) since when, the queue, recent reclaims. Admins
# only: it needs the scope access:services!service=pdl-admin, which the admin role has.
# It listens on 127.0.0.1, port PDL_ADMIN_VIEW_PORT (default 8002). On a swarm it asks
# the manager's Docker engine who runs which engine task on which GPU; on Slurm it asks
# Slurm (squeue, sinfo), the one source there: no file.
if os.environ.get("PDL_SPAWNER", "local") == "slurm":
    _admin_view_env = {
        "PDL_SLURM": "1",
        "PDL_SLURM_PARTITION": c.PDLSlurmSpawner.partition,
        "PDL_SLURM_FLAGS_DB": c.PDLSlurmSpawner.flags_db,
        # tells PDL's jobs from others' (a config that changes the prefix sets this too)
        "PDL_ACCOUNT_PREFIX": c.HostServer.account_prefix if "account_prefix" in c.HostServer else "pdl-",
        "SLURM_CONF": os.environ.get("SLURM_CONF", ""),
        "PATH": os.environ.get("PATH", ""),
    }
elif os.environ.get("PDL_SPAWNER", "local") == "swarm":
    _admin_view_env = {
        "PDL_RESERVATIONS_DB": c.PDLSwarmSpawner.state_db,
        "PDL_DOCKER_HOST": c.PDLSwarmSpawner.client_kwargs["base_url"],
        "PDL_NODES": ",".join(c.PDLSwarmSpawner.nodes),
        "PDL_GPU_RESOURCE": c.PDLSwarmSpawner.gpu_resource if "gpu_resource" in c.PDLSwarmSpawner else "NVIDIA-GPU",
    }
else:
    _admin_view_env = {"PDL_RESERVATIONS_DB": c.PDLLocalSpawner.reservations_db}
    if "pool" in c.PDLLocalSpawner:
        _admin_view_env["PDL_POOL"] = ",".join(c.PDLLocalSpawner.pool)
    if "cpu_slots" in c.PDLLocalSpawner:
        _admin_view_env["PDL_CPU_SLOTS"] = str(c.PDLLocalSpawner.cpu_slots)
    if "nvidia_smi" in c.PDLLocalSpawner:  # the GPUs' types, as the spawner reads them
        _admin_view_env["PDL_NVIDIA_SMI"] = c.PDLLocalSpawner.nvidia_smi
c.JupyterHub.services.append({
    "name": "pdl-admin",
    "url": f"http://127.0.0.1:{int(os.environ.get('PDL_ADMIN_VIEW_PORT', '8002'))}",
    "command": [sys.executable, "-m", "pdl_spawner.admin_view"],
    "environment": _admin_view_env,
    "oauth_no_confirm": True,
})
