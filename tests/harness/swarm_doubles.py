"""A fake Docker Swarm behind docker-py's ``APIClient`` interface, for spawner tests.

:class:`FakeSwarm` implements the calls ``PDLSwarmSpawner`` makes through its one
Docker seam (``self.docker(method, ...)``), over nodes with named fake GPUs. Tasks are
placed the way Swarm places them: a task that reserves a GPU runs on a node with a
free one, or stays pending with "insufficient resources" until one frees. Faults are
injected at the same seam: images that are rejected, a hook run after each call
(to let another party grab GPUs), tasks that take a while to stop.
"""

from __future__ import annotations

import itertools
import threading

import requests
from docker.errors import APIError, NotFound

GPU = "NVIDIA-GPU"


def _not_found(what: str) -> NotFound:
    response = requests.models.Response()
    response.status_code = 404
    return NotFound(f"{what} not found", response=response)


def _as_list(value) -> list:
    return [value] if isinstance(value, str) else list(value or [])


def _label_match(labels: dict, wanted: list[str]) -> bool:
    for item in wanted:
        key, eq, value = item.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


class FakeSwarm:
    """``nodes`` GPUs per node (one each by default), node i at 10.77.0.1<i>."""

    def __init__(self, gpus_per_node=(1, 1, 1), reject_images=(), stop_polls=0):
        self.nodes_ = [
            {"ID": f"node{i}", "Status": {"State": "ready", "Addr": f"10.77.0.1{i}"},
             "Spec": {"Availability": "active", "Role": "manager" if i == 1 else "worker"},
             "Description": {"Hostname": f"node{i}", "Resources": {"GenericResources": [
                 {"NamedResourceSpec": {"Kind": GPU, "Value": f"GPU-fake-{i}-{g}"}} for g in range(n)]}}}
            for i, n in enumerate(gpus_per_node, start=1)
        ]
        self.services_: dict[str, dict] = {}
        self.tasks_: list[dict] = []
        self.secrets_: dict[str, dict] = {}
        self.networks_: dict[str, dict] = {}  # by name
        self.reject_images = set(reject_images)
        self.stop_polls = stop_polls  # tasks() calls a removed or scaled-down service's tasks take to stop
        self.after_call = None  # hook(method, swarm) run after each call
        self.calls: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # -- internals -----------------------------------------------------------

    def _id(self, kind: str) -> str:
        return f"{kind}{next(self._ids)}"

    def _gpus(self, task: dict) -> int:
        res = task["Spec"].get("Resources", {}).get("Reservations", {}).get("GenericResources", [])
        return sum(r["DiscreteResourceSpec"]["Value"] for r in res if r["DiscreteResourceSpec"]["Kind"] == GPU)

    def _free_gpus(self, node: dict) -> list[str]:
        offered = [r["NamedResourceSpec"]["Value"] for r in node["Description"]["Resources"]["GenericResources"]]
        taken = {g for t in self.tasks_ if t.get("NodeID") == node["ID"]
                 and t["Status"]["State"] == "running" for g in t.get("_gpus", [])}
        return [g for g in offered if g not in taken]

    def _begin_stop(self, t: dict) -> None:
        """Task ``t`` is meant to stop: a running one's container takes :attr:`stop_polls`
        looks to end (keeping its GPU meanwhile), as in Swarm; one already stopping goes on."""
        if t["Status"]["State"] == "running" and self.stop_polls and not t.get("_stop_polls"):
            t["_stop_polls"] = self.stop_polls
        elif not t.get("_stop_polls"):
            t["Status"] = {"State": "shutdown"}

    def _schedule(self) -> None:
        for t in self.tasks_:
            if t.get("_stop_polls"):  # removed or scaled down, still stopping: keeps its GPU meanwhile
                t["_stop_polls"] -= 1
                if t["_stop_polls"] <= 0:
                    t["Status"] = {"State": "shutdown"}
            if t["Status"]["State"] not in ("new", "pending") or t["DesiredState"] != "running":
                continue
            image = t["Spec"]["ContainerSpec"]["Image"]
            need = self._gpus(t)
            if image in self.reject_images:
                t["Status"] = {"State": "rejected", "Err": f"No such image: {image}"}
                continue
            spread = sorted(self.nodes_, key=lambda n: sum(
                1 for o in self.tasks_ if o.get("NodeID") == n["ID"] and o["Status"]["State"] == "running"))
            if t.get("NodeID"):  # a global service's task: its node is set
                spread = [n for n in self.nodes_ if n["ID"] == t["NodeID"]]
            for node in spread:
                free = self._free_gpus(node)
                if len(free) >= need:
                    t.update(NodeID=node["ID"], _gpus=free[:need], NetworksAttachments=self._attachments(t))
                    t["Status"] = {"State": "running"}
                    if need:
                        t["GenericResources"] = [{"NamedResourceSpec": {"Kind": GPU, "Value": g}} for g in free[:need]]
                    break
            else:
                t["Status"] = {"State": "pending",
                               "Err": f"no suitable node (insufficient resources on {len(self.nodes_)} nodes)"}

    def _call(self, method: str, result):
        """Record the call and run the hook, without the lock: the hook may act on the
        swarm from other threads (another spawn, in a loop of its own)."""
        self.calls.append(method)
        if self.after_call is not None:
            self._lock.release()  # each method holds it once
            try:
                self.after_call(method, self)
            finally:
                self._lock.acquire()
        return result

    def _attachments(self, task: dict) -> list[dict]:
        """A running task's address on each overlay network it is on (10.201.<network>.<task>)."""
        out = []
        for ref in task["Spec"].get("Networks", []):
            net = next((n for n in self.networks_.values() if n["Id"] == ref["Target"]), None)
            if net is not None:
                host = int(task["ID"].removeprefix("task")) % 250 + 2
                out.append({"Network": {"ID": net["Id"], "Spec": {"Name": net["Name"]}},
                            "Addresses": [f"10.201.{net['_index']}.{host}/24"]})
        return out

    def _new_tasks(self, sid: str, task_template: dict, mode) -> None:
        replicas = ((mode or {}).get("Replicated") or {}).get("Replicas", 1)
        nodes = [n["ID"] for n in self.nodes_] if "Global" in (mode or {}) else [None] * replicas
        for node in nodes:
            task = {"ID": self._id("task"), "ServiceID": sid, "DesiredState": "running",
                    "Version": {"Index": next(self._ids)}, "Spec": task_template, "Status": {"State": "new"}}
            if node:
                task["NodeID"] = node
            self.tasks_.append(task)

    def _service(self, name_or_id: str) -> dict:
        for s in self.services_.values():
            if name_or_id in (s["ID"], s["Spec"]["Name"]):
                return s
        raise _not_found(f"service {name_or_id}")

    # -- APIClient methods ---------------------------------------------------------

    def nodes(self, filters=None):
        with self._lock:
            return self._call("nodes", [dict(n) for n in self.nodes_])

    def inspect_node(self, node_id):
        with self._lock:
            for n in self.nodes_:
                if n["ID"] == node_id:
                    return self._call("inspect_node", dict(n))
            raise _not_found(f"node {node_id}")

    def services(self, filters=None):
        with self._lock:
            wanted = _as_list((filters or {}).get("label"))
            names = _as_list((filters or {}).get("name"))  # Docker matches name prefixes
            found = [s for s in self.services_.values() if _label_match(s["Spec"]["Labels"], wanted)
                     and (not names or any(s["Spec"]["Name"].startswith(n) for n in names))]
            return self._call("services", found)

    def inspect_service(self, service, insert_defaults=None):
        with self._lock:
            return self._call("inspect_service", self._service(service))

    def create_service(self, task_template, name=None, labels=None, mode=None, endpoint_spec=None, **kwargs):
        with self._lock:
            if any(s["Spec"]["Name"] == name for s in self.services_.values()):
                raise APIError(f"rpc error: name conflicts with an existing object: service {name}")
            for ref in task_template["ContainerSpec"].get("Secrets", []):
                if ref["SecretID"] not in self.secrets_:
                    raise _not_found(f"secret {ref['SecretID']}")
            task_template = self._network_ids(task_template)
            sid = self._id("svc")
            spec = {"Name": name, "Labels": labels or {}, "TaskTemplate": task_template, "Mode": mode,
                    "EndpointSpec": endpoint_spec}
            self.services_[sid] = {"ID": sid, "Spec": spec, "Version": {"Index": next(self._ids)}}
            self._new_tasks(sid, task_template, mode)
            self._schedule()
            return self._call("create_service", {"ID": sid})

    def _network_ids(self, task_template: dict) -> dict:
        """The template with network names turned into IDs, as Swarm stores it."""
        refs = []
        for ref in task_template.get("Networks", []):
            net = self.networks_.get(ref["Target"])
            refs.append({**ref, "Target": net["Id"]} if net else ref)
        return {**task_template, "Networks": refs} if refs else task_template

    def update_service(self, service, version, task_template=None, name=None, labels=None, mode=None,
                       endpoint_spec=None, fetch_current_spec=False, **kwargs):
        with self._lock:
            s = self._service(service)
            if version != s["Version"]["Index"]:
                raise APIError("rpc error: update out of sequence")
            if fetch_current_spec:  # docker-py's: what the call leaves out stays as it is
                current = s["Spec"]
                task_template = task_template or current.get("TaskTemplate")
                name, labels = name or current.get("Name"), labels or current.get("Labels")
                mode, endpoint_spec = mode or current.get("Mode"), endpoint_spec or current.get("EndpointSpec")
            task_template = self._network_ids(task_template)
            s["Spec"].update(Name=name, Labels=labels or {}, TaskTemplate=task_template, Mode=mode,
                             EndpointSpec=endpoint_spec)
            s["Version"] = {"Index": next(self._ids)}
            for t in self.tasks_:
                if t["ServiceID"] == s["ID"] and t["DesiredState"] == "running":
                    t["DesiredState"] = "shutdown"
                    self._begin_stop(t)
            self._new_tasks(s["ID"], task_template, mode)
            self._schedule()
            return self._call("update_service", None)

    def create_network(self, name, driver=None, labels=None, **kwargs):
        with self._lock:
            if name in self.networks_:
                raise APIError(f"network with name {name} already exists")
            nid = self._id("net")
            self.networks_[name] = {"Id": nid, "Name": name, "Driver": driver, "Labels": labels or {},
                                    "_index": len(self.networks_)}
            return self._call("create_network", {"Id": nid})

    def networks(self, names=None, ids=None, filters=None):
        with self._lock:
            wanted = _as_list((filters or {}).get("label"))
            found = [{k: v for k, v in n.items() if not k.startswith("_")} for n in self.networks_.values()
                     if _label_match(n["Labels"], wanted)]
            return self._call("networks", found)

    def remove_service(self, service):
        with self._lock:
            s = self._service(service)
            del self.services_[s["ID"]]
            for t in self.tasks_:
                if t["ServiceID"] == s["ID"]:
                    t["DesiredState"] = "remove"
                    self._begin_stop(t)
            self._schedule()
            return self._call("remove_service", True)

    def tasks(self, filters=None):
        with self._lock:
            self._schedule()
            filters = filters or {}
            wanted = set(_as_list(filters.get("service")))
            ids = {self._service(w)["ID"] for w in wanted} if wanted else None
            desired = set(_as_list(filters.get("desired-state")))
            found = [
                {k: v for k, v in t.items() if not k.startswith("_")} for t in self.tasks_
                if (ids is None or t["ServiceID"] in ids) and (not desired or t["DesiredState"] in desired)
            ]
            return self._call("tasks", found)

    def create_secret(self, name, data, labels=None, driver=None):
        with self._lock:
            sid = self._id("secret")
            self.secrets_[sid] = {"ID": sid, "Spec": {"Name": name, "Labels": labels or {}}, "_data": data}
            return self._call("create_secret", {"ID": sid})

    def secrets(self, filters=None):
        with self._lock:
            wanted = _as_list((filters or {}).get("label"))
            found = [{k: v for k, v in s.items() if k != "_data"} for s in self.secrets_.values()
                     if _label_match(s["Spec"]["Labels"], wanted)]
            return self._call("secrets", found)

    def remove_secret(self, id):
        with self._lock:
            if id not in self.secrets_:
                raise _not_found(f"secret {id}")
            users = [s["Spec"]["Name"] for s in self.services_.values()
                     if any(r["SecretID"] == id for r in s["Spec"]["TaskTemplate"]["ContainerSpec"]["Secrets"])]
            if users:
                raise APIError(f"rpc error: secret {id} is in use by the following service: {users[0]}")
            del self.secrets_[id]
            return self._call("remove_secret", True)

    # -- for tests -----------------------------------------------------------------

    def secret_data(self, secret_id: str) -> bytes:
        return self.secrets_[secret_id]["_data"]

    def running(self, role: str | None = None) -> list[dict]:
        """Active tasks (optionally of PDL services with ``pdl.role`` = role)."""
        with self._lock:
            self._schedule()
            out = []
            for t in self.tasks_:
                s = self.services_.get(t["ServiceID"])
                if t["Status"]["State"] in ("running", "pending") and (
                        role is None or (s and s["Spec"]["Labels"].get("pdl.role") == role)):
                    out.append(t)
            return out
