"""Every setting an admin needs, in one place: the users' port range, the admin's own
config file (loaded only when nobody but root or the hub's user can change it), one
table of variables whose every setting takes effect through its variable and its
``c.*`` line (those of every kind and of the embedded default here; Swarm's and
Slurm's in their folders), refusals in one line, and the documents written from the code.

The config is loaded as ``scripts/serve`` checks it (traitlets' PyFileConfigLoader, in a
subprocess): no hub is started."""

from __future__ import annotations

import os

import pytest

from hub_config_probe import REPO, config_file, expected, load_config, probe, refusal, settings
from pdl_spawner.settings.local_config import local_config_problem
from pdl_spawner.settings.values import port_range

pytestmark = pytest.mark.unit

NOBODY = 65534


# -- PDL_PORT_RANGE ----------------------------------------------------------------------

def test_a_port_range_is_low_dash_high():
    assert port_range("20000-32000") == (20000, 32000)
    assert port_range(" 1024-65535 ") == (1024, 65535)


@pytest.mark.parametrize("bad", ["", "20000", "20000-", "-32000", "a-b", "80-90", "1000-2000", "30000-20000",
                                 "20000-20000", "20000-70000", "20000:32000", "20000-32000-40000"])
def test_a_bad_port_range_is_one_line_naming_what_is_valid(bad):
    with pytest.raises(ValueError) as info:
        port_range(bad)
    message = str(info.value)
    assert message.startswith("PDL_PORT_RANGE must be LOW-HIGH with 1024 <= LOW < HIGH <= 65535")
    assert message.endswith(f"got {bad!r}") and "\n" not in message


# -- the local config file: who can change it ------------------------------------------------

def test_a_file_only_its_owner_can_change_is_safe(tmp_path):
    assert local_config_problem(config_file(tmp_path / "etc")) is None
    assert local_config_problem(config_file(tmp_path / "private", mode=0o600)) is None


def test_a_file_group_or_others_can_write_is_refused(tmp_path):
    for mode in (0o664, 0o646):
        problem = local_config_problem(config_file(tmp_path / f"m{mode:o}", mode=mode))
        assert problem and "writable by group or others" in problem and "chmod go-w" in problem, problem
        assert "\n" not in problem


def test_a_file_in_a_folder_others_can_write_is_refused_unless_the_folder_is_sticky(tmp_path):
    open_folder = tmp_path / "open"
    path = config_file(open_folder)
    open_folder.chmod(0o777)  # anyone could replace hub_config.py with their own
    problem = local_config_problem(path)
    assert problem and f"its folder {open_folder} is writable by group or others" in problem, problem
    sticky = tmp_path / "tmp"
    path = config_file(sticky)
    sticky.chmod(0o1777)  # like /tmp: others may add files, not replace the hub's
    assert local_config_problem(path) is None


def test_a_file_in_a_safe_folder_below_an_open_one_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    path = config_file(tmp_path / "open" / "pdl")
    (tmp_path / "open").chmod(0o777)  # whoever can write here can rename pdl/ and put their own
    problem = local_config_problem(path)
    assert problem and f"its folder {tmp_path / 'open'} is writable" in problem, problem


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_or_folder_of_another_user_is_refused(tmp_path):
    path = config_file(tmp_path / "theirs")
    os.chown(path, NOBODY, NOBODY)  # mode 0644, but its owner can change it
    problem = local_config_problem(path)
    assert problem == f"{path} belongs to uid {NOBODY}, not to root or the hub's user: chown root it"
    path = config_file(tmp_path / "their-folder")
    os.chown(path.parent, NOBODY, NOBODY)
    problem = local_config_problem(path)
    assert problem and f"its folder {path.parent} belongs to uid {NOBODY}" in problem, problem


def test_a_symlink_or_a_folder_is_refused(tmp_path):
    target = config_file(tmp_path / "real")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    assert local_config_problem(link) == f"{link} is a symbolic link: name the file itself"
    assert local_config_problem(tmp_path / "real") == f"{tmp_path / 'real'} is not a regular file"
    assert local_config_problem(tmp_path / "missing.py") == f"{tmp_path / 'missing.py'} does not exist"


def test_a_safe_file_reached_through_a_link_to_an_open_folder_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    config_file(open_folder)
    open_folder.chmod(0o777)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "pdl").symlink_to(open_folder)  # the path looks safe; where it leads is not
    problem = local_config_problem(tmp_path / "etc" / "pdl" / "hub_config.py")
    assert problem and f"its folder {open_folder} is writable" in problem, problem


# -- jupyterhub_config.py with the local config file ------------------------------------------

def test_the_admins_config_file_wins_and_the_admin_view_sees_its_settings(tmp_path):
    path = config_file(tmp_path / "etc")
    path.write_text('c.PDLSlurmSpawner.time_limit = 480\nc.JupyterHub.port = 8123\n'
                    'c.PDLLocalSpawner.pool = ["cpu:0", "cpu:1"]\n'
                    'c.JupyterHub.services.append({"name": "lab-extra", "command": ["true"]})\n')
    got = settings(load_config(tmp_path, PDL_LOCAL_CONFIG=str(path), PDL_HUB_PORT="8000", PDL_POOL="cpu:0"))
    assert (got["time_limit"], got["port"]) == (480, 8123)  # over PDL_HUB_PORT too
    assert got["admin_view"]["pool"] == ["cpu:0", "cpu:1"]  # the admin view is told the final pool
    assert {"idle-culler", "pdl-admin", "lab-extra"} <= set(got["services"])  # added to, not replaced


def test_pdl_balance_reaches_every_users_server_and_a_bad_one_stops_the_hub_in_one_line(tmp_path):
    got = settings(load_config(tmp_path, PDL_BALANCE="off", PDL_PREFLIGHT_SKIP="gpu"))
    assert got["user_env"] == {"PDL_BALANCE": "off", "PDL_PREFLIGHT_SKIP": "gpu"}
    assert settings(load_config(tmp_path))["user_env"] is None  # unset: each server's own default, auto
    assert refusal(load_config(tmp_path, PDL_BALANCE="sometimes")) == (
        "PDL_BALANCE must be one of auto, on, off, got 'sometimes'")


def test_an_unsafe_config_file_stops_the_hub_in_one_line(tmp_path):
    path = config_file(tmp_path / "etc", mode=0o666)
    path.write_text("c.PDLSlurmSpawner.time_limit = 1\n")
    line = refusal(load_config(tmp_path, PDL_LOCAL_CONFIG=str(path)))
    assert line == ("PDL_LOCAL_CONFIG: not loaded, since the hub runs it as its own code: "
                    f"{path} is writable by group or others (mode 666): chmod go-w it")


def test_a_named_config_file_that_is_missing_stops_the_hub_and_none_at_all_is_fine(tmp_path):
    line = refusal(load_config(tmp_path, PDL_LOCAL_CONFIG=str(tmp_path / "nope.py")))
    assert line.startswith(f"PDL_LOCAL_CONFIG names {tmp_path / 'nope.py'}, which does not exist")
    if not os.path.lexists("/etc/pdl/hub_config.py"):  # the default: loaded only when present
        assert settings(load_config(tmp_path))["time_limit"] is None


def test_pdl_port_range_sets_the_servers_ports_or_stops_in_one_line(tmp_path):
    got = settings(load_config(tmp_path, PDL_PORT_RANGE="21000-21999"))
    assert got["ports"] == [21000, 21999]
    assert settings(load_config(tmp_path))["ports"] is None  # the trait's default, 20000-32000
    line = refusal(load_config(tmp_path, PDL_PORT_RANGE="80-90"))
    assert line == "PDL_PORT_RANGE must be LOW-HIGH with 1024 <= LOW < HIGH <= 65535 (e.g. 20000-32000), got '80-90'"


def test_pdl_session_limit_s_sets_the_longest_session_or_stops_in_one_line(tmp_path):
    got = settings(load_config(tmp_path, PDL_SESSION_LIMIT_S="28800", PDL_SESSION_WARN_S="300"))
    assert (got["session_limit_s"], got["session_warning_s"]) == (28800, 300)
    assert settings(load_config(tmp_path))["session_limit_s"] is None  # the trait's default: off
    line = refusal(load_config(tmp_path, PDL_SESSION_LIMIT_S="8h"))
    assert line == ("PDL_SESSION_LIMIT_S must be a number of seconds >= 0 "
                    "(e.g. 28800 for 8 h; 0: off), got '8h'")


# -- one table of settings (pdl_spawner/settings) ------------------------------------------

#: A valid value, not the default, of each variable of every kind that sets a trait.
SAMPLES = {"PDL_HOMES_ROOT": "/srv/homes", "PDL_ACCOUNT_PREFIX": "lab-", "PDL_HUB_PORT": "8123",
           "PDL_HUB_INTERNAL_PORT": "8181", "PDL_PORT_RANGE": "21000-21999", "PDL_LOGIN_ATTEMPTS": "7",
           "PDL_LOGIN_LOCKOUT_S": "90", "PDL_PENDING_SIGNUPS": "3", "PDL_SIGNUPS_PER_ADDRESS": "4",
           "PDL_DEFAULT_WORKERS": "2", "PDL_ENGINE_IDLE_TIMEOUT": "600", "PDL_SESSION_LIMIT_S": "28800",
           "PDL_SESSION_MAX_S": "57600", "PDL_SESSION_WARN_S": "300", "PDL_GPU_IDLE_FLAG_S": "1800",
           "PDL_GPU_IDLE_RELEASE_S": "3600", "PDL_POOL": "cpu:0,cpu:1", "PDL_ACCOUNTS": "lab",
           "PDL_ACCOUNT_UID_MIN": "2000", "PDL_ALLOWED_GROUP": "ml",
           "PDL_LDAP_USER_DN": "uid={username},ou=people,dc=lab,dc=example", "PDL_OIDC_CLIENT_ID": "pdl-hub",
           "PDL_OIDC_USERNAME_CLAIM": "email"}

def local_trait_variables():
    from pdl_spawner.kinds import kind_named
    from pdl_spawner.settings.variables import VARIABLES

    return [v for v in (*VARIABLES, *kind_named("local").variables) if v.trait]


def test_every_setting_of_the_embedded_default_takes_effect_through_its_variable(tmp_path):
    variables = local_trait_variables()
    assert sorted(SAMPLES) == sorted(v.name for v in variables), "a sample value for each variable with a trait"
    got = settings(probe(tmp_path, [v.trait for v in variables], **SAMPLES, PDL_AUTH="pam"))  # lab accounts need it
    assert {v.name: got[v.trait] for v in variables} == {v.name: expected(v, SAMPLES) for v in variables}


def test_every_setting_of_the_embedded_default_takes_effect_through_its_c_line(tmp_path):
    variables = local_trait_variables()
    path = config_file(tmp_path / "etc")
    path.write_text("".join(f"c.{v.trait} = {expected(v, SAMPLES)!r}\n" for v in variables))
    got = settings(probe(tmp_path, [v.trait for v in variables], PDL_LOCAL_CONFIG=str(path), PDL_AUTH="pam"))
    assert {v.name: got[v.trait] for v in variables} == {v.name: expected(v, SAMPLES) for v in variables}


def test_a_core_setting_reaches_the_kind_and_the_kinds_own_section_wins(tmp_path):
    """Guards the core's settings, once ignored: ``c.SpawnerCore.default_workers = 7`` left
    the local spawner at its own default."""
    path = config_file(tmp_path / "etc")
    path.write_text("c.SpawnerCore.default_workers = 7\nc.SpawnerCore.queue_timeout = 11\n"
                    "c.PDLLocalSpawner.queue_timeout = 22\n")
    got = settings(probe(tmp_path, ["SpawnerCore.default_workers", "SpawnerCore.queue_timeout"],
                         PDL_LOCAL_CONFIG=str(path), PDL_DEFAULT_WORKERS="2"))
    assert got == {"SpawnerCore.default_workers": 7, "SpawnerCore.queue_timeout": 22}
    assert settings(probe(tmp_path, ["SpawnerCore.default_workers"]))["SpawnerCore.default_workers"] == 3


@pytest.mark.parametrize("env, line", [
    ({"PDL_PORT_RANGES": "21000-21999"}, "PDL_PORT_RANGES is not a setting of PDL's hub: did you mean PDL_PORT_RANGE?"),
    ({"PDL_NODES": "gpu1"}, "PDL_NODES applies to PDL_SPAWNER=swarm only, and this hub's is local: unset it"),
    ({"PDL_SPAWNER": "kubernetes"}, "PDL_SPAWNER must be one of local, slurm, swarm, got 'kubernetes'"),
    ({"PDL_HUB_PORT": "http"}, "PDL_HUB_PORT must be a TCP port, 1-65535, got 'http'"),
    ({"PDL_KEEP_SERVERS": "yes"}, "PDL_KEEP_SERVERS must be 1 or 0, got 'yes'"),
])
def test_an_unknown_variable_or_value_stops_the_hub_in_one_line_naming_what_is_valid(tmp_path, env, line):
    assert refusal(load_config(tmp_path, **env)) == line


@pytest.mark.parametrize("lines, line", [
    ("c.SpawnerCore.default_worker = 2\n",
     "c.SpawnerCore.default_worker is not a setting of SpawnerCore: did you mean c.SpawnerCore.default_workers?"),
    ("c.PDLLocalSpawner.pol = ['cpu:0']\n",
     "c.PDLLocalSpawner.pol is not a setting of PDLLocalSpawner: did you mean c.PDLLocalSpawner.pool?"),
    ("c.PDLLocalSpawnr.pool = ['cpu:0']\n",
     "c.PDLLocalSpawnr is not a class of PDL's settings: did you mean c.PDLLocalSpawner?"),
    ("c.SessionLimit.session_limit_s = 60\n",
     "c.SessionLimit is not a class of settings: set its settings as c.SpawnerCore.<name> or c.PDLLocalSpawner.<name>"),
    ("c.PDLAuthenticator.allowed_failed_login = 3\n", "c.PDLAuthenticator.allowed_failed_login is not a setting "
     "of PDLAuthenticator: did you mean c.PDLAuthenticator.allowed_failed_logins?"),
])
def test_a_c_line_that_no_class_reads_stops_the_hub_in_one_line_naming_the_nearest(tmp_path, lines, line):
    path = config_file(tmp_path / "etc")
    path.write_text(lines)
    assert refusal(load_config(tmp_path, PDL_LOCAL_CONFIG=str(path))) == line


def test_the_admin_guides_table_is_the_codes_table_of_variables():
    from pdl_spawner.settings.guide import variables_table

    text = (REPO / "docs" / "admin.md").read_text()
    section = text.split("\n## Every setting, in one place\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == variables_table(), "docs/admin.md: paste `python -m pdl_spawner.settings.guide variables`"


def test_docs_settings_lists_every_c_setting_of_pdls_classes():
    from pdl_spawner.settings.guide import settings_document

    assert (REPO / "docs" / "settings.md").read_text() == settings_document(), \
        "docs/settings.md: write `python -m pdl_spawner.settings.guide settings` into it"


def test_lab_accounts_without_a_login_that_proves_them_stop_the_hub_in_one_line(tmp_path):
    """PDL_ACCOUNTS=lab with PDL's own sign-up pages would let anyone claim a name, and so
    the lab's account of that name."""
    assert "needs a login that proves that account, PDL_AUTH=pam" in refusal(
        load_config(tmp_path, PDL_ACCOUNTS="lab"))
    assert refusal(load_config(tmp_path, PDL_AUTH="sso")) == "PDL_AUTH must be one of native, pam, ldap, oidc, got 'sso'"
    assert settings(load_config(tmp_path, PDL_AUTH="pam", PDL_ACCOUNTS="lab", PDL_ALLOWED_GROUP="ml"))


LDAP_TRAITS = [f"PDLLDAPAuthenticator.{name}" for name in ("server_address", "server_port", "tls_strategy",
                                                           "bind_dn_template", "allowed_unix_group")]


@pytest.mark.parametrize("url, address, port, strategy", [
    ("ldaps://ldap.lab.example", "ldap.lab.example", 636, "on_connect"),
    ("ldap://ldap.lab.example:3389", "ldap.lab.example", 3389, "before_bind"),  # StartTLS before the password
    ("ldap://127.0.0.1:3389/", "127.0.0.1", 3389, "insecure"),  # never leaves the machine
])
def test_pdl_auth_ldap_binds_to_the_named_directory_and_never_sends_a_password_in_plain_off_the_machine(
        tmp_path, url, address, port, strategy):
    got = settings(probe(tmp_path, LDAP_TRAITS, PDL_AUTH="ldap", PDL_LDAP_URL=url, PDL_ALLOWED_GROUP="ml",
                         PDL_LDAP_USER_DN="uid={username},ou=people,dc=lab,dc=example"))
    assert got == {"PDLLDAPAuthenticator.server_address": address, "PDLLDAPAuthenticator.server_port": port,
                   "PDLLDAPAuthenticator.tls_strategy": strategy,
                   "PDLLDAPAuthenticator.bind_dn_template": ["uid={username},ou=people,dc=lab,dc=example"],
                   "PDLLDAPAuthenticator.allowed_unix_group": "ml"}


@pytest.mark.parametrize("env, line", [
    ({"PDL_LDAP_USER_DN": "uid={username},dc=lab"},
     "PDL_AUTH=ldap needs the lab's directory: PDL_LDAP_URL=ldaps://HOST[:PORT] (or ldap://, with StartTLS)"),
    ({"PDL_LDAP_URL": "ldaps://ldap.lab.example"}, "PDL_AUTH=ldap needs where a person's entry is: "
     "PDL_LDAP_USER_DN, e.g. uid={username},ou=people,dc=lab,dc=example"),
    ({"PDL_LDAP_URL": "http://ldap.lab.example", "PDL_LDAP_USER_DN": "uid={username},dc=lab"},
     "PDL_LDAP_URL must be ldaps://HOST[:PORT] or ldap://HOST[:PORT], got 'http://ldap.lab.example'"),
    ({"PDL_LDAP_URL": "ldaps://ldap.lab.example", "PDL_LDAP_USER_DN": "uid=ann,dc=lab"},
     "PDL_LDAP_USER_DN must be a DN with {username} for the login name, e.g. "
     "uid={username},ou=people,dc=lab,dc=example, got 'uid=ann,dc=lab'"),
])
def test_an_ldap_login_without_its_directory_or_entries_stops_the_hub_in_one_line(tmp_path, env, line):
    assert refusal(load_config(tmp_path, PDL_AUTH="ldap", **env)) == line


def test_an_oidc_login_without_its_provider_client_or_a_private_secret_stops_the_hub_in_one_line(tmp_path):
    secret = tmp_path / "client-secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o644)
    closed = "http://127.0.0.1:1"  # nothing listens on port 1
    assert refusal(load_config(tmp_path, PDL_AUTH="oidc", PDL_OIDC_ISSUER="http://sso.lab.example")) == (
        "PDL_OIDC_ISSUER must be https:// (http only to 127.0.0.1), got 'http://sso.lab.example'")
    assert refusal(load_config(tmp_path, PDL_AUTH="oidc", PDL_OIDC_ISSUER=closed)) == (
        f"PDL_OIDC_ISSUER: the OpenID Connect provider's discovery document {closed}/.well-known/"
        "openid-configuration could not be read: ConnectionError")
    assert refusal(load_config(tmp_path, PDL_AUTH="oidc", PDL_OIDC_CLIENT_SECRET_FILE=str(secret))) == (
        f"PDL_OIDC_CLIENT_SECRET_FILE: {secret} is open to group or others (mode 644): chmod 600 it")
    secret.chmod(0o600)
    assert refusal(load_config(tmp_path, PDL_AUTH="oidc", PDL_OIDC_CLIENT_SECRET_FILE=str(secret))) == (
        "PDL_AUTH=oidc needs PDL_OIDC_ISSUER=https://sso.lab.example/realms/lab")
