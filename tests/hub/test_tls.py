"""pdl_spawner/hub/tls.py: a hub the lab reaches over HTTPS. Every combination that cannot
work stops the hub at start with one line naming what is valid (read here as the hub
prints it, through jupyterhub_config.py); a good one sets JupyterHub's own TLS, the
proxy's redirect of plain HTTP, Secure cookies and HSTS."""

from __future__ import annotations

import datetime

import pytest

from hub_config_probe import load_config, probe, refusal, settings
from lab_tls import DAY, TestCA

pytestmark = pytest.mark.unit

HOST = "hub.lab.test"
URL = f"https://{HOST}"


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def good(ca):
    return ca.issue([HOST, f"*.{HOST}"], stem="good")


def tls_env(issued, **more) -> dict:
    return {"PDL_PUBLIC_URL": URL, "PDL_TLS_CERT": str(issued.cert), "PDL_TLS_KEY": str(issued.key), **more}


def test_a_certificate_for_the_name_and_its_wildcard_serves_https_on_443_and_redirects_http(tmp_path, good):
    got = settings(probe(tmp_path, ["JupyterHub.ssl_cert", "JupyterHub.ssl_key", "JupyterHub.port", "JupyterHub.ip",
                                    "JupyterHub.hub_ip", "ConfigurableHTTPProxy.command",
                                    "ConfigurableHTTPProxy.api_url", "JupyterHub.tornado_settings"],
                         **tls_env(good, PDL_HUB_IP="0.0.0.0", PDL_HSTS_S="31536000")))
    assert (got["JupyterHub.ssl_cert"], got["JupyterHub.ssl_key"]) == (str(good.cert), str(good.key))
    assert got["JupyterHub.port"] == 443 and got["JupyterHub.ip"] == "0.0.0.0"
    assert got["ConfigurableHTTPProxy.command"][-2:] == ["--redirect-port", "80"]
    # what the lab's interface must never carry: the hub's API and the proxy's stay on loopback
    assert got["JupyterHub.hub_ip"] == "127.0.0.1"
    assert got["ConfigurableHTTPProxy.api_url"].startswith("http://127.0.0.1:")
    # the hub's cookies and, through JUPYTERHUB_COOKIE_OPTIONS, every server's
    assert got["JupyterHub.tornado_settings"]["cookie_options"] == {"secure": True}
    assert got["JupyterHub.tornado_settings"]["headers"]["Strict-Transport-Security"] == \
        "max-age=31536000; includeSubDomains"


def test_a_public_port_other_than_the_hubs_is_where_http_is_sent(tmp_path, good):
    got = settings(probe(tmp_path, ["JupyterHub.port", "ConfigurableHTTPProxy.command"],
                         **tls_env(good, PDL_HUB_PORT="8443", PDL_HTTP_PORT="8080")))
    assert got["JupyterHub.port"] == 8443
    assert got["ConfigurableHTTPProxy.command"][-4:] == ["--redirect-port", "8080", "--redirect-to", "443"]
    assert "--redirect-port" not in settings(probe(tmp_path, ["ConfigurableHTTPProxy.command"],
                                                   **tls_env(good, PDL_HTTP_PORT="0")))[
        "ConfigurableHTTPProxy.command"]


def test_behind_the_labs_reverse_proxy_the_hub_serves_plain_http_and_trusts_only_that_proxy(tmp_path):
    got = settings(probe(tmp_path, ["JupyterHub.ssl_cert", "JupyterHub.ip", "JupyterHub.trusted_downstream_ips",
                                    "JupyterHub.tornado_settings"],
                         PDL_PUBLIC_URL=URL, PDL_TLS_PROXY="127.0.0.1"))
    assert got == {"JupyterHub.ssl_cert": "", "JupyterHub.ip": "127.0.0.1",
                   "JupyterHub.trusted_downstream_ips": ["127.0.0.1"],
                   "JupyterHub.tornado_settings": {"cookie_options": {"secure": True}}}


def test_the_embedded_default_stays_plain_http_on_loopback(tmp_path):
    got = settings(probe(tmp_path, ["JupyterHub.ssl_cert", "JupyterHub.ip", "JupyterHub.port",
                                    "JupyterHub.tornado_settings"]))
    assert got == {"JupyterHub.ssl_cert": "", "JupyterHub.ip": "127.0.0.1", "JupyterHub.port": 8000,
                   "JupyterHub.tornado_settings": {}}


@pytest.mark.parametrize("env, line", [
    ({"PDL_PUBLIC_URL": URL},
     "PDL_PUBLIC_URL is https, but nothing serves TLS: set PDL_TLS_CERT and PDL_TLS_KEY (the hub serves it), "
     "or PDL_TLS_PROXY to the address of the reverse proxy in front that does"),
    ({"PDL_PUBLIC_URL": f"http://{HOST}", "PDL_TLS_PROXY": "127.0.0.1"},
     "PDL_TLS_PROXY is for a hub reached over TLS: PDL_PUBLIC_URL must be https://NAME"),
    ({"PDL_PUBLIC_URL": URL, "PDL_TLS_CERT": "/etc/ssl/hub.crt"},
     "PDL_TLS_CERT and PDL_TLS_KEY go together: set both (the certificate and its private key, PEM) or neither"),
    ({"PDL_HTTP_PORT": "80"},
     "PDL_HTTP_PORT redirects plain HTTP to the hub's own HTTPS: it needs PDL_TLS_CERT and PDL_TLS_KEY "
     "(behind PDL_TLS_PROXY, the proxy redirects)"),
    ({"PDL_HSTS_S": "3600"}, "PDL_HSTS_S tells browsers to use https only: it needs PDL_PUBLIC_URL=https://NAME"),
    ({"PDL_HUB_IP": "hub.lab.test"},
     "PDL_HUB_IP must be an IP address of this machine (127.0.0.1: this machine only; 0.0.0.0: every interface), "
     "got 'hub.lab.test'"),
    ({"PDL_PUBLIC_URL": URL, "PDL_TLS_PROXY": "nginx"},
     "PDL_TLS_PROXY must be comma-separated IP addresses (e.g. 127.0.0.1), got 'nginx'"),
])
def test_a_way_in_that_cannot_work_stops_the_hub_in_one_line(tmp_path, env, line):
    assert refusal(load_config(tmp_path, **env)) == line


def test_a_certificate_with_the_proxy_in_front_too_is_one_or_the_other(tmp_path, good):
    assert refusal(load_config(tmp_path, **tls_env(good, PDL_TLS_PROXY="127.0.0.1"))) == (
        "set PDL_TLS_CERT/PDL_TLS_KEY (the hub serves TLS) or PDL_TLS_PROXY (a reverse proxy in front serves it), "
        "not both")


def test_a_plain_http_url_with_a_certificate_is_refused(tmp_path, good):
    assert refusal(load_config(tmp_path, **tls_env(good, PDL_PUBLIC_URL=f"http://{HOST}"))) == (
        "PDL_TLS_CERT is for a hub reached over TLS: PDL_PUBLIC_URL must be https://NAME")


def test_a_certificate_without_the_wildcard_is_refused_naming_both_names(tmp_path, ca):
    only_hub = ca.issue([HOST], stem="only-hub")
    assert refusal(load_config(tmp_path, **tls_env(only_hub))) == (
        f"PDL_TLS_CERT: {only_hub.cert} names hub.lab.test; a hub at https://hub.lab.test needs both hub.lab.test "
        "and *.hub.lab.test (each user's server is at <name>.hub.lab.test) in its subject alternative names")
    other = ca.issue(["hub.other.test", "*.hub.other.test"], stem="other")
    assert "names *.hub.other.test, hub.other.test; a hub at https://hub.lab.test needs both" in \
        refusal(load_config(tmp_path, **tls_env(other)))


def test_an_expired_or_not_yet_valid_certificate_is_refused(tmp_path, ca):
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = ca.issue([HOST, f"*.{HOST}"], stem="expired", not_before=now - 30 * DAY, not_after=now - DAY)
    assert refusal(load_config(tmp_path, **tls_env(expired))) == (
        f"PDL_TLS_CERT: {expired.cert} expired on {now - DAY:%Y-%m-%d %H:%M} UTC: renew it")
    early = ca.issue([HOST, f"*.{HOST}"], stem="early", not_before=now + DAY, not_after=now + 30 * DAY)
    assert refusal(load_config(tmp_path, **tls_env(early))) == (
        f"PDL_TLS_CERT: {early.cert} is not valid before {now + DAY:%Y-%m-%d %H:%M} UTC")


def test_a_certificate_or_key_the_hub_cannot_read_or_use_is_refused(tmp_path, ca, good):
    missing = tmp_path / "missing.crt"
    assert refusal(load_config(tmp_path, **tls_env(good, PDL_TLS_CERT=str(missing)))) == (
        f"PDL_TLS_CERT: {missing} cannot be read (No such file or directory)")
    not_pem = tmp_path / "hub.crt"
    not_pem.write_text("not a certificate\n")
    assert refusal(load_config(tmp_path, **tls_env(good, PDL_TLS_CERT=str(not_pem)))) == (
        f"PDL_TLS_CERT: {not_pem} is not a PEM certificate (-----BEGIN CERTIFICATE-----)")
    other_key = ca.issue([HOST, f"*.{HOST}"], stem="other-key").key
    assert refusal(load_config(tmp_path, **tls_env(good, PDL_TLS_KEY=str(other_key)))) == (
        f"PDL_TLS_KEY: {other_key} is not the private key of the certificate {good.cert}")
    not_key = tmp_path / "hub.key"
    not_key.touch(mode=0o600)
    not_key.write_text("not a key\n")
    assert refusal(load_config(tmp_path, **tls_env(good, PDL_TLS_KEY=str(not_key)))) == (
        f"PDL_TLS_KEY: {not_key} is not an unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)")


def test_a_private_key_others_can_read_is_refused(tmp_path, ca):
    """The attack: a key the lab's other accounts can read lets any of them pose as the hub."""
    issued = ca.issue([HOST, f"*.{HOST}"], stem="open-key")
    issued.key.chmod(0o644)
    assert refusal(load_config(tmp_path, **tls_env(issued))) == (
        f"PDL_TLS_KEY: {issued.key} is open to group or others (mode 644): chmod 600 it")


def test_the_docs_self_signed_certificate_is_one_the_hub_serves(tmp_path):
    """docs/admin.md's commands for a trial certificate, run as written (its folder
    moved here): the hub takes what they make for hub.lab.example."""
    import re
    import subprocess

    from hub_config_probe import REPO
    from pdl_spawner.hub.tls import certificate_problem

    section = (REPO / "docs" / "admin.md").read_text().split("\n## Opening the hub to the lab\n", 1)[1]
    commands = re.search(r"```bash\n(.*?)```", section.split("\n## ", 1)[0], re.S).group(1)
    assert "/etc/pdl/tls" in commands
    done = subprocess.run(["bash", "-euc", commands.replace("/etc/pdl/tls", str(tmp_path / "tls"))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert certificate_problem(str(tmp_path / "tls" / "hub.crt"), str(tmp_path / "tls" / "hub.key"),
                               "hub.lab.example") is None
