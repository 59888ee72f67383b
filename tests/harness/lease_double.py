"""A local spawner whose user's server is a double of its lease API: the one seam a
lease test replaces (``IdleEngines.fetch_lease``); everything else (the slot ledger,
the checks, the answers' encoding) is the real spawner's."""

from __future__ import annotations

from types import SimpleNamespace

from pdl.lease import Answer, ExtendAnswer, decode


class LeaseDouble:
    """The server's lease API (``/pdl/api/lease``) as a spawner sees it: what the user's
    server says (JSON; None: it does not answer), and the hub's answers (to requests for
    workers, and to wishes for more time), read back as lease messages."""

    def __init__(self, lease: dict | None):
        self.lease, self.answers, self.extensions = lease, [], []

    async def __call__(self, body=None, part=""):
        if body is None:
            return self.lease
        if part == "extension":
            self.extensions.append(decode(ExtendAnswer, body))
        else:
            self.answers.append(decode(Answer, body))
        return {"ok": True}


def fake_user(name: str):
    """Just enough of a JupyterHub user for a spawner built outside a hub."""
    return SimpleNamespace(name=name, admin=False, url=f"/user/{name}/", escaped_name=name, id=1,
                           server=None, spawners={}, settings={}, orm_user=None)


def lease_spawner(tmp_path, lease: dict | None, **traits):
    """alice's local spawner over a pool of 3 CPU slots (ledger under ``tmp_path``, idle
    timeout 9 s; ``traits`` may say otherwise), its server's lease API a :class:`LeaseDouble`."""
    from pdl_spawner.local.spawner import PDLLocalSpawner

    spawner = PDLLocalSpawner(user=fake_user("alice"), system_users=False,
                              reservations_db=str(tmp_path / "r.sqlite"),
                              home_dir_template=str(tmp_path / "home" / "{username}"),
                              **{"engine_idle_timeout": 9, "pool": ["cpu:0", "cpu:1", "cpu:2"], **traits})
    spawner.fetch_lease = LeaseDouble(lease)
    return spawner
