"""The lab's directory for tests: a real OpenLDAP ``slapd`` of the test's own on
127.0.0.1 (its own ``cn=config`` and database, in the test's folder) holding the lab's
people (``posixAccount``, with passwords) and groups (``posixGroup``), and the machine's
``nslcd`` pointed at it while it runs, so that those people are Unix accounts of the
machine (``pwd.getpwnam`` finds them: ``scripts/ldap-up`` puts ``ldap`` in
/etc/nsswitch.conf). One directory at a time on a machine (nslcd is the machine's): a
lock file keeps a second one waiting. slapd dies with the test process; nslcd (which
changes its uid, and so forgets that) is stopped by the next directory when a killed
run left it. A machine whose own nslcd runs is never taken over. Needs root;
:func:`problem` says why it cannot run here."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import grp
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hub_harness import free_port
from waiting import wait_until

SBIN = ("/usr/sbin", "/sbin")
#: The directory's base; people under ``ou=people``, groups under ``ou=groups``.
BASE = "dc=lab,dc=test"
NSLCD_CONF = Path("/etc/nslcd.conf")
NSLCD_RUN = Path("/run/nslcd")
#: The first line of the nslcd config this harness writes: an nslcd running with another
#: config is the machine's own, which the tests must not take over.
MARK = "# written by PDL's tests (tests/harness/lab_directory.py) while a lab directory runs"
#: Held while a directory runs: nslcd and its config are the machine's.
LOCK = Path("/run/pdl-test-lab-directory.lock")
SCHEMAS = ("core", "cosine", "nis", "inetorgperson")


def _program(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def problem() -> str | None:
    """None when a lab directory can run here, else why not (one line)."""
    if os.geteuid() != 0:
        return "the lab directory needs root (nslcd and its config are the machine's)"
    missing = [p for p in ("slapd", "slapadd", "ldapadd", "nslcd") if _program(p) is None]
    if missing:
        return f"{', '.join(missing)} missing: run scripts/ldap-up"
    lines = Path("/etc/nsswitch.conf").read_text().splitlines()
    if not all(any(line.startswith(db + ":") and " ldap" in line for line in lines) for db in ("passwd", "group")):
        return "/etc/nsswitch.conf does not look accounts up in LDAP: run scripts/ldap-up"
    if _running_nslcd() is not None and not _ours():
        return "the machine's own nslcd runs (/etc/nslcd.conf is not the tests'): the tests would take it over"
    return None


def _running_nslcd() -> int | None:
    """The pid of the nslcd that runs now (its pid file's), or None."""
    try:
        pid = int((NSLCD_RUN / "nslcd.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _ours() -> bool:
    try:
        return NSLCD_CONF.read_text().startswith(MARK)
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process's thread that started it
    ends (a test run killed leaves no directory behind)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Person:
    """One of the lab's people: login ``name``, ``uid`` (their own group has the same
    number), ``password``, ``home`` (made, theirs, mode 0700) and the lab's ``groups``
    they are in."""
    name: str
    uid: int
    password: str
    home: Path
    groups: tuple[str, ...] = ()


@dataclass
class Directory:
    """A running lab directory: ``url`` (``ldap://127.0.0.1:PORT``), its people by name,
    ``group_ids`` of the lab's groups, and the DN template of a person's entry."""
    url: str
    port: int
    people: dict[str, Person]
    group_ids: dict[str, int]
    user_dn: str = f"uid={{username}},ou=people,{BASE}"
    admin_dn: str = f"cn=admin,{BASE}"
    admin_password: str = field(default="", repr=False)


def free_ids(count: int) -> int:
    """The first of ``count`` numbers in a row that no account or group of the machine
    has as its uid or gid, from 40000 up: uids for people whose own group has their
    number, and gids for the lab's groups."""
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    first = 40000 + secrets.randbelow(20000)
    while any(n in taken for n in range(first, first + count)):
        first += count
    return first


def _ssha(password: str) -> str:
    salt = secrets.token_bytes(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()



def _config_ldif(folder: Path, admin_password: str) -> str:
    schemas = "".join(f"include: file:///etc/ldap/schema/{name}.ldif\n\n" for name in SCHEMAS)
    return f"""dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: {folder}/slapd.pid

dn: cn=module{{0}},cn=config
objectClass: olcModuleList
cn: module{{0}}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

{schemas}dn: olcDatabase={{1}}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {{1}}mdb
olcSuffix: {BASE}
olcRootDN: cn=admin,{BASE}
olcRootPW: {_ssha(admin_password)}
olcDbDirectory: {folder}/data
olcAccess: {{0}}to attrs=userPassword by self write by anonymous auth by * none
olcAccess: {{1}}to * by * read
"""


def _entries_ldif(people: dict[str, Person], group_ids: dict[str, int]) -> str:
    parts = [f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\no: lab\ndc: lab\n",
             f"dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people\n",
             f"dn: ou=groups,{BASE}\nobjectClass: organizationalUnit\nou: groups\n"]
    for p in people.values():
        parts.append(f"dn: uid={p.name},ou=people,{BASE}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
                     f"uid: {p.name}\ncn: {p.name}\nsn: {p.name}\nmail: {p.name}@lab.test\nuidNumber: {p.uid}\n"
                     f"gidNumber: {p.uid}\nhomeDirectory: {p.home}\nloginShell: /bin/bash\n"
                     f"userPassword: {_ssha(p.password)}\n")
        parts.append(f"dn: cn={p.name},ou=groups,{BASE}\nobjectClass: posixGroup\ncn: {p.name}\n"
                     f"gidNumber: {p.uid}\n")
    for group, gid in group_ids.items():
        members = "".join(f"memberUid: {p.name}\n" for p in people.values() if group in p.groups)
        parts.append(f"dn: cn={group},ou=groups,{BASE}\nobjectClass: posixGroup\ncn: {group}\n"
                     f"gidNumber: {gid}\n{members}")
    return "\n".join(parts)


@contextlib.contextmanager
def _machine_lock():
    with open(LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another directory's tests finish first
        yield


@contextlib.contextmanager
def _nslcd(url: str, log: Path):
    """The machine's nslcd, pointed at ``url`` (its config restored afterwards)."""
    leftover = _running_nslcd()
    if leftover is not None and _ours():  # a killed run's: its directory is gone
        os.kill(leftover, signal.SIGTERM)
        wait_until(lambda: _running_nslcd() is None, 10, what="a killed test run's nslcd to stop")
    before = NSLCD_CONF.read_bytes() if NSLCD_CONF.exists() and not _ours() else None
    NSLCD_RUN.mkdir(exist_ok=True)
    shutil.chown(NSLCD_RUN, "nslcd", "nslcd")
    fd = os.open(NSLCD_CONF, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w") as conf:
        conf.write(f"{MARK}\nuid nslcd\ngid nslcd\nuri {url}/\nbase {BASE}\n")
    with open(log, "ab") as out:
        daemon = subprocess.Popen([_program("nslcd"), "-n"], stdout=out, stderr=out, preexec_fn=_die_with_parent)
    try:
        yield daemon
    finally:
        _stop(daemon)
        if before is None:
            NSLCD_CONF.unlink(missing_ok=True)
        else:
            NSLCD_CONF.write_bytes(before)


@contextlib.contextmanager
def lab_directory(folder: Path, people: list[Person], groups: dict[str, int]):
    """Within: a :class:`Directory` of ``people`` and the lab's ``groups`` (name: gid),
    served by slapd on 127.0.0.1 and resolved by the machine through nslcd; the people's
    homes made. Afterwards nslcd and slapd stopped (no process left), the homes kept in
    ``folder`` (the test's)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for p in people:
        p.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chown(p.home, p.uid, p.uid)
    admin_password = secrets.token_urlsafe(12)
    by_name = {p.name: p for p in people}
    config = folder / "slapd.d"
    config.mkdir(mode=0o700)
    (folder / "data").mkdir(mode=0o700)
    ldif = folder / "config.ldif"
    ldif.write_text(_config_ldif(folder, admin_password))
    ldif.chmod(0o600)
    subprocess.run([_program("slapadd"), "-n", "0", "-F", str(config), "-l", str(ldif)], check=True,
                   capture_output=True)
    entries = folder / "entries.ldif"
    entries.write_text(_entries_ldif(by_name, groups))
    entries.chmod(0o600)
    subprocess.run([_program("slapadd"), "-n", "1", "-F", str(config), "-l", str(entries)], check=True,
                   capture_output=True)
    with _machine_lock():
        port = free_port()
        url = f"ldap://127.0.0.1:{port}"
        with open(folder / "slapd.log", "ab") as log:
            slapd = subprocess.Popen([_program("slapd"), "-d", "0", "-F", str(config), "-h", f"{url}/"],
                                     stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_die_with_parent)
        try:
            wait_until(lambda: _answers(port), 10, what="slapd to listen")
            with _nslcd(url, folder / "nslcd.log"):
                first = people[0].name
                wait_until(lambda: _resolves(first), 10, what=f"nslcd to resolve {first}")
                yield Directory(url, port, by_name, dict(groups), admin_password=admin_password)
        finally:
            _stop(slapd)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s: ``process`` is gone on return."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _resolves(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
