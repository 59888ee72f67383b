"""Golden tests of the Swarm specs PDLSwarmSpawner creates, and their secure defaults.

The builders are pure, so whole specs are compared to expected dicts, as kubespawner's
tests do for pods. No Docker needed.
"""

from __future__ import annotations

import json

import pytest

from pdl.connection import PORTS_NEEDED, ClusterKeys, engine_file, notebook_secret
from pdl_spawner.swarm import specs as swarm_specs
from pdl_spawner.swarm.specs import Owner

pytestmark = pytest.mark.unit

NS = 1_000_000_000
ALICE = Owner("alice")
#: Homes on shared storage, a dataset folder on every node.
SHARED = swarm_specs.Storage(home="path", home_path_template="/srv/pdl/home/{username}",
                             data={"kind": "path", "source": "/srv/pdl/data"})
PORTS = [20001 + i for i in range(1 + PORTS_NEEDED)]
KEYS = ClusterKeys(curve_publickey="P" * 40, curve_secretkey="S" * 40, session_key="k" * 64)
API_TOKEN = "hub-api-token-of-alice"
SECURE = {
    "User": "1000:1000",
    "Init": True,
    "CapabilityDrop": ["ALL"],
    "Privileges": {"NoNewPrivileges": True},
    "StopGracePeriod": 5 * NS,
}


def notebook(**overrides):
    kwargs = dict(
        name="pdl-alice", image="pdl-notebook:test", owner=ALICE,
        command=["pdl-singleuser", "--SingleUserNotebookApp.default_url=/lab"],
        env={"JUPYTERHUB_USER": "alice", "JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:20001/user/alice/"},
        secret_id="sec1", secret_name="pdl-alice-notebook-0a0b", user="1000:1000", home="/home/pdl",
        ports=PORTS, gpus=3, network="pdl-private-4",
    )
    return swarm_specs.notebook_service(**{**kwargs, **overrides})


def engine(**overrides):
    kwargs = dict(
        name="pdl-alice-engine-2", image="pdl-notebook:test", owner=ALICE, index=2,
        env={"CINIC10_DIR": "/data/cinic10"}, secret_id="sec2", secret_name="pdl-alice-engine-0c0d",
        user="1000:1000", home="/home/pdl", gpu_resource="NVIDIA-GPU", network="pdl-private-4",
    )
    return swarm_specs.engine_service(**{**kwargs, **overrides})


def test_notebook_service_spec():
    labels = {
        "pdl.owner": "alice", "pdl.user": "alice", "pdl.server": "", "pdl.role": "notebook",
        "pdl.ports": ",".join(map(str, PORTS)), "pdl.gpus": "3", "pdl.network": "pdl-private-4",
    }
    assert notebook() == {
        "name": "pdl-alice",
        "labels": labels,
        "mode": {"Replicated": {"Replicas": 1}},
        # only the Jupyter server's port is on the node's address; the controller's are not
        "endpoint_spec": {"Mode": "dnsrr", "Ports": [
            {"Protocol": "tcp", "TargetPort": PORTS[0], "PublishedPort": PORTS[0], "PublishMode": "host"},
        ]},
        "task_template": {
            "ContainerSpec": {
                "Image": "pdl-notebook:test",
                "Command": ["pdl-singleuser", "--SingleUserNotebookApp.default_url=/lab"],
                "Env": [
                    "HOME=/home/pdl",
                    "JUPYTERHUB_SERVICE_URL=http://0.0.0.0:20001/user/alice/",
                    "JUPYTERHUB_USER=alice",
                    "PDL_CLUSTER_DIR=/tmp/pdl-cluster",
                    "PDL_CONTROLLER_SECRET=/run/secrets/pdl-notebook.json",
                    "PDL_WORKERS=3",
                ],
                "Labels": labels,
                "Dir": "/home/pdl",
                "Secrets": [{
                    "SecretID": "sec1", "SecretName": "pdl-alice-notebook-0a0b",
                    "File": {"Name": "pdl-notebook.json", "UID": "1000", "GID": "1000", "Mode": 0o400},
                }],
                **SECURE,
            },
            "Networks": [{"Target": "pdl-private-4"}],
            "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
        },
    }


def test_engine_service_spec_reserves_one_gpu():
    labels = {"pdl.owner": "alice", "pdl.user": "alice", "pdl.server": "", "pdl.role": "engine", "pdl.index": "2"}
    assert engine() == {
        "name": "pdl-alice-engine-2",
        "labels": labels,
        "mode": {"Replicated": {"Replicas": 1}},
        "endpoint_spec": {"Mode": "dnsrr"},
        "task_template": {
            "ContainerSpec": {
                "Image": "pdl-notebook:test",
                "Command": ["pdl-engine"],
                "Env": [
                    "CINIC10_DIR=/data/cinic10",
                    "HOME=/home/pdl",
                    "PDL_ENGINE_CONNECTION=/run/secrets/pdl-engine.json",
                    "PDL_ENGINE_HOST={{.Node.Hostname}}",
                    "PDL_GPU_RESOURCE=NVIDIA-GPU",
                ],
                "Labels": labels,
                "Dir": "/home/pdl",
                "Secrets": [{
                    "SecretID": "sec2", "SecretName": "pdl-alice-engine-0c0d",
                    "File": {"Name": "pdl-engine.json", "UID": "1000", "GID": "1000", "Mode": 0o400},
                }],
                **SECURE,
            },
            "Networks": [{"Target": "pdl-private-4"}],
            "Resources": {"Reservations": {"GenericResources": [
                {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}},
            ]}},
            "Placement": {"Preferences": [{"Spread": {"SpreadDescriptor": "node.id"}}]},
            "RestartPolicy": {"Condition": "on-failure", "Delay": 1 * NS, "MaxAttempts": 3, "Window": 60 * NS},
        },
    }


def test_an_engine_of_a_gpu_type_runs_only_on_that_types_nodes_and_says_its_type():
    spec = engine(gpu_type="t4", avoid_hosts=["pdl-node9"])
    assert spec["task_template"]["Placement"]["Constraints"] == [
        "node.hostname!=pdl-node9", "node.labels.pdl.gpu-type==t4"]
    assert spec["labels"]["pdl.gpu-type"] == "t4"
    assert "Constraints" not in engine()["task_template"]["Placement"] and "pdl.gpu-type" not in engine()["labels"]


def test_each_container_is_bounded_by_its_limits_and_an_engine_reserves_its_cores():
    limits = swarm_specs.Limits(memory_bytes=2 * 2**30, cpus=1.5, processes=512)
    assert notebook(limits=limits)["task_template"]["Resources"] == {
        "Limits": {"MemoryBytes": 2 * 2**30, "NanoCPUs": 1_500_000_000, "Pids": 512}}
    assert engine(limits=limits)["task_template"]["Resources"] == {
        "Limits": {"MemoryBytes": 2 * 2**30, "NanoCPUs": 1_500_000_000, "Pids": 512},
        "Reservations": {"NanoCPUs": 1_500_000_000, "GenericResources": [
            {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}}]},
    }
    # a limit of 0 is none of that kind
    assert engine(limits=swarm_specs.Limits(processes=64))["task_template"]["Resources"] == {
        "Limits": {"Pids": 64},
        "Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 1}}]},
    }
    with pytest.raises(ValueError, match=r"^cpus must be 0 \(no limit\) or more, got -1$"):
        swarm_specs.Limits(cpus=-1)


def test_named_servers_get_their_own_owner_label():
    spec = engine(owner=Owner("alice", "big"))
    assert spec["labels"]["pdl.owner"] == "alice/big" and spec["labels"]["pdl.server"] == "big"
    assert Owner("alice", "big").filter() == {"label": ["pdl.owner=alice/big"]}


def test_private_networks_are_overlays_no_container_can_attach_to():
    assert swarm_specs.private_network(4) == {
        "name": "pdl-private-4", "driver": "overlay", "attachable": False, "check_duplicate": True,
        "labels": {"pdl.role": "network", "pdl.index": "4"},
    }


def test_the_network_keeper_idles_on_every_node_on_every_network_with_nothing_mounted():
    spec = swarm_specs.network_keeper_service(image="pdl-notebook:test", networks=["pdl-private-0", "pdl-private-1"],
                                              user="1000:1000")
    labels = {"pdl.role": "network-keeper"}
    assert spec == {
        "name": "pdl-network-keeper",
        "labels": labels,
        "mode": {"Global": {}},
        "endpoint_spec": {"Mode": "dnsrr"},
        "task_template": {
            "ContainerSpec": {
                "Image": "pdl-notebook:test", "Command": ["sleep", "infinity"], "Env": [], "Labels": labels,
                "Dir": "/", "Secrets": [], "ReadOnly": True, **SECURE,
            },
            "Networks": [{"Target": "pdl-private-0"}, {"Target": "pdl-private-1"}],
            "Resources": {"Limits": {"MemoryBytes": 32 * 1024 * 1024}},
            "RestartPolicy": {"Condition": "any", "Delay": 1 * NS},
        },
    }


def test_the_gpu_reader_prints_every_gpus_use_on_every_node_reserving_none_without_network():
    mounts = [{"Type": "bind", "Source": "/opt/smi", "Target": "/opt/smi", "ReadOnly": True}]
    spec = swarm_specs.gpu_reader_service(image="pdl-engine:test", nvidia_smi="/opt/smi/nvidia-smi", every_s=30,
                                          user="1000:1000", mounts=mounts)
    labels = {"pdl.role": "gpu-reader"}
    assert spec == {
        "name": "pdl-gpu-reader",
        "labels": labels,
        "mode": {"Global": {}},
        "endpoint_spec": {"Mode": "dnsrr"},
        "task_template": {
            "ContainerSpec": {
                "Image": "pdl-engine:test",
                "Command": ["/opt/smi/nvidia-smi", "--query-gpu=uuid,utilization.gpu,memory.used,memory.total",
                            "--format=csv,noheader,nounits", "-l", "30"],
                "Env": ["NVIDIA_DRIVER_CAPABILITIES=utility", "NVIDIA_VISIBLE_DEVICES=all",
                        "PDL_NODE={{.Node.Hostname}}"],
                "Labels": labels, "Dir": "/", "Secrets": [], "ReadOnly": True, "Mounts": mounts, **SECURE,
            },
            "Resources": {"Limits": {"MemoryBytes": 64 * 1024 * 1024}},
            "RestartPolicy": {"Condition": "any", "Delay": 5 * NS},
            "LogDriver": {"Name": "json-file", "Options": {"max-size": "1m", "max-file": "2"}},
        },
    }
    with pytest.raises(ValueError, match="root"):
        swarm_specs.gpu_reader_service(image="x", nvidia_smi="nvidia-smi", every_s=30, user="0:0")


def _containers():
    yield notebook()["task_template"]["ContainerSpec"]
    yield engine()["task_template"]["ContainerSpec"]
    for storage in (swarm_specs.Storage(), SHARED):
        mounts = storage.mounts("alice", "/home/pdl")
        yield notebook(mounts=mounts)["task_template"]["ContainerSpec"]
        yield engine(mounts=mounts)["task_template"]["ContainerSpec"]


@pytest.mark.parametrize("container", list(_containers()), ids=[
    "notebook", "engine", "notebook-volumes", "engine-volumes", "notebook-shared", "engine-shared"])
def test_secure_defaults(container):
    assert container["User"] != "root" and not container["User"].startswith("0")
    assert container["Privileges"]["NoNewPrivileges"] is True
    assert "Privileged" not in container  # Swarm has no such field; nothing sets one
    assert container["CapabilityDrop"] == ["ALL"] and not container.get("CapabilityAdd")
    assert container["Init"] is True
    for mount in container.get("Mounts", []):
        assert "docker.sock" not in mount["Source"] and mount["Source"] not in ("/", "/var/run", "/run")
        assert mount["ReadOnly"] is True if mount["Target"] == "/data" else "ReadOnly" not in mount
    for ref in container["Secrets"]:
        assert ref["File"]["Mode"] == 0o400 and ref["File"]["UID"] == "1000"


@pytest.mark.parametrize("user", ["0:0", "root", "0", "1000:0", ""])
def test_root_is_refused(user):
    with pytest.raises(ValueError):
        notebook(user=user)


@pytest.mark.parametrize("source", [
    "/var/run/docker.sock", "/run/docker.sock", "/var/run", "/", "/srv/x/docker.sock", "//", "//etc/shadow", "/etc",
    "/etc/shadow", "/var/lib/docker/volumes", "/proc/1/root", "/srv/../var/run", "/run/containerd/containerd.sock",
    "data",
])
def test_docker_socket_and_host_system_mounts_are_refused(source):
    with pytest.raises(ValueError, match="refusing to mount|must be absolute"):
        engine(mounts=[{"Type": "bind", "Source": source, "Target": "/data"}])
    # nor through a local volume that binds a host path
    bind_volume = {"Type": "volume", "Source": "v", "Target": "/data", "VolumeOptions": {
        "DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind", "device": source}}}}
    with pytest.raises(ValueError, match="refusing to mount|must be absolute"):
        engine(mounts=[bind_volume])
    ok = engine(mounts=[{"Type": "bind", "Source": "/srv/data", "Target": "/data", "ReadOnly": True}])
    assert ok["task_template"]["ContainerSpec"]["Mounts"] == [
        {"Type": "bind", "Source": "/srv/data", "Target": "/data", "ReadOnly": True}]


@pytest.mark.parametrize("name", sorted(swarm_specs.SECRET_ENV))
def test_secret_environment_variables_are_refused(name):
    with pytest.raises(ValueError, match="Docker secrets"):
        notebook(env={name: "x"})


def test_secrets_are_only_in_secret_payloads():
    """The token and keys appear in the secrets' data, and nowhere in any service spec."""
    nb_secret = swarm_specs.secret(name="s", data=notebook_secret(KEYS, PORTS[1:], API_TOKEN), labels={})
    eng_secret = swarm_specs.secret(name="e", data=engine_file(KEYS, PORTS[1:], "10.77.0.12"), labels={})
    assert API_TOKEN.encode() in nb_secret["data"] and KEYS.curve_secretkey.encode() in nb_secret["data"]
    assert KEYS.curve_secretkey.encode() not in eng_secret["data"]  # engines get only the public key
    assert KEYS.session_key.encode() in eng_secret["data"]
    for spec in (notebook(), engine()):
        text = json.dumps(spec)
        for value in (API_TOKEN, KEYS.curve_secretkey, KEYS.curve_publickey, KEYS.session_key):
            assert value not in text


def test_secret_spec():
    spec = swarm_specs.secret(name="pdl-alice-engine-0c0d", data={"b": 1, "a": "x"},
                              labels=ALICE.labels("secret", kind="engine"))
    assert spec == {
        "name": "pdl-alice-engine-0c0d",
        "data": b'{"a": "x", "b": 1}',
        "labels": {"pdl.owner": "alice", "pdl.user": "alice", "pdl.server": "", "pdl.role": "secret",
                   "pdl.kind": "engine"},
    }


# -- storage ---------------------------------------------------------------------------

HOME_VOLUME = {
    "Type": "volume", "Source": "pdl-home-alice", "Target": "/home/jovyan",
    "VolumeOptions": {"Labels": {"pdl.volume": "home", "pdl.user": "alice"}, "DriverConfig": {"Name": "local"}},
}
CACHE_VOLUME = {
    "Type": "volume", "Source": "pdl-cache-alice", "Target": "/var/tmp",
    "VolumeOptions": {"Labels": {"pdl.volume": "cache", "pdl.user": "alice"}, "DriverConfig": {"Name": "local"}},
}


def test_default_storage_is_a_home_volume_and_a_cache_volume_per_user():
    storage = swarm_specs.Storage()
    assert storage.mounts("alice", "/home/jovyan") == [HOME_VOLUME, CACHE_VOLUME]
    assert storage.env() == {"CINIC10_CACHE": "/var/tmp/cinic10"}
    assert swarm_specs.Storage(cache_volume="").mounts("alice", "/home/jovyan") == [HOME_VOLUME]
    assert swarm_specs.Storage(cache_volume="").env() == {}


def test_home_volume_on_nfs_fills_in_the_user():
    storage = swarm_specs.Storage(home_volume_driver_opts={
        "type": "nfs", "o": "addr=10.0.0.5,rw,nfsvers=4", "device": ":/export/home/{username}"})
    assert storage.home_mount("alice", "/home/jovyan") == {
        **HOME_VOLUME,
        "VolumeOptions": {"Labels": {"pdl.volume": "home", "pdl.user": "alice"}, "DriverConfig": {
            "Name": "local",
            "Options": {"type": "nfs", "o": "addr=10.0.0.5,rw,nfsvers=4", "device": ":/export/home/alice"},
        }},
    }
    plugin = swarm_specs.Storage(home_volume_driver="rexray/efs").home_mount("alice", "/home/jovyan")
    assert plugin["VolumeOptions"]["DriverConfig"] == {"Name": "rexray/efs"}


def test_engines_get_the_shared_home_the_read_only_dataset_and_the_node_cache():
    """home_storage="path" and a dataset folder: the whole engine container, mounts and env."""
    mounts = SHARED.mounts("alice", "/home/jovyan")
    spec = engine(mounts=mounts, env=SHARED.env(), home="/home/jovyan")
    container = spec["task_template"]["ContainerSpec"]
    assert container == {
        "Image": "pdl-notebook:test",
        "Command": ["pdl-engine"],
        "Env": [
            "CINIC10_CACHE=/var/tmp/cinic10",
            "CINIC10_DIR=/data/cinic10",
            "HOME=/home/jovyan",
            "PDL_ENGINE_CONNECTION=/run/secrets/pdl-engine.json",
            "PDL_ENGINE_HOST={{.Node.Hostname}}",
            "PDL_GPU_RESOURCE=NVIDIA-GPU",
        ],
        "Labels": spec["labels"],
        "Dir": "/home/jovyan",
        "Secrets": container["Secrets"],
        "Mounts": [
            {"Type": "bind", "Source": "/srv/pdl/home/alice", "Target": "/home/jovyan"},
            {"Type": "bind", "Source": "/srv/pdl/data", "Target": "/data", "ReadOnly": True},
            CACHE_VOLUME,
        ],
        **SECURE,
    }
    # the notebook gets the same mounts, so what rank 0 saves is where the notebook looks
    assert notebook(mounts=mounts)["task_template"]["ContainerSpec"]["Mounts"] == container["Mounts"]


def test_dataset_on_nfs_is_a_read_only_volume_named_after_its_options():
    data = {"kind": "nfs", "addr": "10.0.0.5", "export": "/export/data/"}
    mount = swarm_specs.Storage(data=data, cache_volume="").data_mount()
    assert mount == {
        "Type": "volume", "Source": mount["Source"], "Target": "/data", "ReadOnly": True,
        "VolumeOptions": {"Labels": {"pdl.volume": "data"}, "DriverConfig": {
            "Name": "local", "Options": {"type": "nfs", "o": "addr=10.0.0.5,ro", "device": ":/export/data"}}},
    }
    assert mount["Source"].startswith("pdl-data-") and len(mount["Source"]) == len("pdl-data-") + 12
    v4 = swarm_specs.Storage(data={**data, "options": "nfsvers=4"}).data_mount()
    assert v4["VolumeOptions"]["DriverConfig"]["Options"]["o"] == "addr=10.0.0.5,ro,nfsvers=4"
    assert v4["Source"] != mount["Source"]  # Docker keeps a volume's first options: new options, new volume
    assert swarm_specs.Storage(data=data, cache_volume="").env() == {"CINIC10_DIR": "/data/cinic10"}


@pytest.mark.parametrize("settings, message", [
    ({"home": "nfs"}, "home_storage must be 'volume' or 'path', got 'nfs'"),
    ({"home": "path"}, "home_storage is 'path' but home_path_template is empty"),
    ({"home": "path", "home_path_template": "/srv/pdl/home"}, "must contain {username}"),
    ({"home": "path", "home_path_template": "srv/{username}"}, "must be absolute"),
    ({"home": "path", "home_path_template": "/etc/{username}"}, "refusing to mount /etc/user"),
    ({"data": {"kind": "path", "source": "/var/run"}}, "refusing to mount /var/run"),
    ({"data": {"kind": "path", "source": "/"}}, "refusing to mount /"),
    ({"data": {"kind": "path"}}, "data_storage must be None, {'kind': 'path'"),
    ({"data": {"kind": "s3", "source": "/x"}}, "data_storage must be None"),
    ({"data": "/srv/pdl/data"}, "data_storage must be None"),
    ({"data": {"kind": "nfs", "addr": "10.0.0.5", "export": "data"}}, "data_storage must be None"),
    ({"data": {"kind": "path", "source": "/srv/d", "readonly": False}}, "data_storage must be None"),
    ({"cache_volume": "pdl cache"}, "cache_volume must be a Docker volume name"),
])
def test_storage_settings_that_cannot_work_are_one_line_errors(settings, message):
    with pytest.raises(ValueError) as e:
        swarm_specs.Storage(**settings).mounts("alice", "/home/jovyan")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_two_mounts_at_one_target_are_refused():
    extra = {"Type": "bind", "Source": "/srv/other", "Target": "/home/jovyan/"}
    with pytest.raises(ValueError, match="two mounts at /home/jovyan"):
        swarm_specs.check_mounts([HOME_VOLUME, extra])
