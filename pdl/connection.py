"""ipyparallel connection info for a controller whose engines run on other machines.

Under Docker Swarm the hub generates everything the user's cluster needs to connect,
before any container starts (pure functions here, apart from :meth:`ClusterKeys.generate`):

- :class:`ClusterKeys`: the controller's CurveZMQ keypair (Z85 text, 40 characters
  each) and the HMAC-SHA256 key that signs every message (hex). Engines and clients
  need the controller's *public* key and the HMAC key; only the controller has the
  secret key. A peer without both cannot complete the CurveZMQ handshake or get a
  message accepted, so it cannot register.
- the controller's ports, chosen by the hub (:data:`PORTS_NEEDED` of them): the
  controller binds them on every interface of its node (``tcp://0.0.0.0``), engines
  connect to the node's address, clients on the same node to 127.0.0.1.

The notebook container receives :func:`notebook_secret` (keys, ports, the hub API
token) as one Docker secret; :func:`install_controller_files` writes the two files
ipyparallel's controller reuses (``IPController.reuse_files``). Each engine container
receives :func:`engine_file` as its own Docker secret and starts with ``--file=``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

#: Engine-facing channels with one port each (ipyparallel 9's engine connection file).
ENGINE_CHANNELS = ("registration", "control", "mux", "task", "iopub", "hb_ping", "hb_pong")
#: Leaf broadcast schedulers (2 ** IPController.broadcast_scheduler_depth, default depth 1).
BROADCAST_LEAVES = 2
#: Client-facing channels; the client shares the engines' registration port.
CLIENT_CHANNELS = ("control", "mux", "task", "iopub", "notification", "broadcast")
#: How many ports a controller needs from the hub.
PORTS_NEEDED = len(ENGINE_CHANNELS) + BROADCAST_LEAVES + len(CLIENT_CHANNELS)
#: Ports a controller binds on 127.0.0.1 for its own processes: one per broadcast leaf
#: (from the root scheduler) and the monitor's.
INTERNAL_PORTS = BROADCAST_LEAVES + 1
#: Every port a controller binds: the engines' and clients' (:data:`PORTS_NEEDED`) and its
#: internal ones. ipyparallel takes them, in its own order, from ``IPController.ports``.
CONTROLLER_PORTS = PORTS_NEEDED + INTERNAL_PORTS

#: Interface the controller binds in its container (host networking: every node address).
BIND_ALL = "tcp://0.0.0.0"
_SESSION = {"pack": "json", "unpack": "json", "signature_scheme": "hmac-sha256", "ssh": ""}


@dataclass(frozen=True)
class ClusterKeys:
    """One user's cluster credentials (all text: Z85 curve keys, hex HMAC key)."""

    curve_publickey: str
    curve_secretkey: str
    session_key: str

    @classmethod
    def generate(cls) -> ClusterKeys:
        import zmq

        public, secret = zmq.curve_keypair()
        return cls(public.decode("ascii"), secret.decode("ascii"), secrets.token_hex(32))

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _credentials(keys: ClusterKeys) -> dict:
    return {"key": keys.session_key, "curve_serverkey": keys.curve_publickey, **_SESSION}


def _port_map(ports: list[int]) -> tuple[dict, dict]:
    if len(ports) != PORTS_NEEDED or len(set(ports)) != PORTS_NEEDED:
        raise ValueError(f"need {PORTS_NEEDED} distinct ports, got {ports!r}")
    it = iter(ports)
    engine = {name: next(it) for name in ENGINE_CHANNELS}
    engine["broadcast"] = [next(it) for _ in range(BROADCAST_LEAVES)]
    client = {"registration": engine["registration"], **{name: next(it) for name in CLIENT_CHANNELS}}
    client["task_scheme"] = "leastload"
    return engine, client


def controller_files(keys: ClusterKeys, ports: list[int], bind: str = BIND_ALL) -> dict[str, dict]:
    """The controller's own ``{"engine": ..., "client": ...}`` connection files.

    Both bind on ``bind`` (every interface by default: engines and clients share the
    registration port, so they must share the interface); ``location`` is empty so
    that clients on the same node connect to 127.0.0.1.
    """
    engine, client = _port_map(ports)
    common = {"interface": bind, "location": "", **_credentials(keys)}
    return {"engine": {**engine, **common}, "client": {**client, **common}}


def engine_file(keys: ClusterKeys, ports: list[int], controller_addr: str) -> dict:
    """The connection file an engine on another node uses to reach the controller."""
    engine, _ = _port_map(ports)
    return {**engine, "interface": f"tcp://{controller_addr}", "location": controller_addr, **_credentials(keys)}


def notebook_secret(keys: ClusterKeys, ports: list[int], api_token: str, bind: str = BIND_ALL) -> dict:
    """Everything secret the notebook container needs, as one JSON document."""
    return {
        "api_token": api_token,
        "controller_keys": {"curve_publickey": keys.curve_publickey, "curve_secretkey": keys.curve_secretkey},
        "controller_files": controller_files(keys, ports, bind),
    }


def read_secret(path: str | os.PathLike) -> dict:
    """Load a JSON secret file (a Docker secret under /run/secrets)."""
    return json.loads(Path(path).read_text())


def install_controller_files(secret: dict, security_dir: str | os.PathLike, cluster_id: str) -> list[Path]:
    """Write the controller's connection files (mode 0600) where ipyparallel looks for them."""
    security_dir = Path(security_dir)
    security_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    for kind, info in secret["controller_files"].items():
        path = security_dir / f"ipcontroller-{cluster_id}-{kind}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, indent=2)
        os.chmod(path, 0o600)
        written.append(path)
    return written


#: ipyparallel controller options for a controller that reuses the files above.
CONTROLLER_ARGS = ("--IPController.reuse_files=True", "--IPController.enable_curve=True")


def controller_config(secret: dict):
    """traitlets Config giving the controller its curve keypair from the notebook secret."""
    from traitlets.config import Config

    keys = secret["controller_keys"]
    config = Config()
    config.IPController.curve_publickey = keys["curve_publickey"].encode("ascii")
    config.IPController.curve_secretkey = keys["curve_secretkey"].encode("ascii")
    return config
