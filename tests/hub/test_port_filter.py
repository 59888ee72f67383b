"""The bind filter of a server's cgroup (:mod:`pdl_spawner.host.port_filter`) with the real
kernel: a process in the cgroup binds, of the hub's range, only its server's ports.
Needs root and a cgroup v2 mount: skips otherwise, and fails instead with ``$CI``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from pdl_spawner.host import device_cgroup, port_filter

pytestmark = pytest.mark.integration

LOW, HIGH, OWN_LOW, OWN_HIGH = 29901, 29910, 29904, 29906

BINDS = """
import json, socket
found = {}
for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    for port in (%d, %d, %d, %d, %d, %d, %d, %d, 0):
        s = socket.socket(family)
        try:
            s.bind((address, port)); found[f"{family.name} {port}"] = "bound"
        except OSError as e:
            found[f"{family.name} {port}"] = e.strerror
        finally:
            s.close()
print(json.dumps(found))
""" % (LOW - 1, LOW, OWN_LOW - 1, OWN_LOW, OWN_HIGH, OWN_HIGH + 1, HIGH, HIGH + 1)


def test_a_server_binds_only_its_own_ports_of_the_range():
    """Guards ``PortCgroup.restrict``: EPERM for the range's other ports (next to its own
    too), IPv4 and IPv6; its own ports, ports outside the range and port 0 bind; a second
    restrict replaces the first (the new own port binds, the old ones do not)."""
    problem = port_filter.support()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"{problem} (CI is set: failing instead of skipping)")
        pytest.skip(problem)
    cgroup = port_filter.PortCgroup("ann", parent=f"pdl-test-{secrets.token_hex(3)}")
    try:
        cgroup.restrict(LOW, HIGH, OWN_LOW, OWN_HIGH)

        def binds() -> dict:
            done = subprocess.run([sys.executable, "-I", "-S", "-c", BINDS], capture_output=True, text=True,
                                  preexec_fn=lambda: device_cgroup.join(cgroup.procs_file), timeout=30)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        found = binds()
        refused = "Operation not permitted"
        for family in ("AF_INET", "AF_INET6"):
            for port in (LOW, OWN_LOW - 1, OWN_HIGH + 1, HIGH):
                assert found[f"{family} {port}"] == refused, found
            for port in (LOW - 1, OWN_LOW, OWN_HIGH, HIGH + 1, 0):
                assert found[f"{family} {port}"] == "bound", found
        cgroup.restrict(LOW, HIGH, LOW, LOW)
        found = binds()
        assert found[f"AF_INET {LOW}"] == "bound" and found[f"AF_INET {OWN_LOW}"] == refused, found
    finally:
        cgroup.remove()
        cgroup.path.parent.rmdir()
