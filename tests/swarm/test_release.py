"""The release pipeline (.github/workflows/release.yml, scripts/release-images): it
cannot run here, so it is linted (the workflow schema, and zizmor's security audits,
offline) and checked to build what docs/admin.md says, through the one script an admin
also runs by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def lint(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_there_is_a_release_workflow():
    assert REPO / ".github" / "workflows" / "release.yml" in WORKFLOWS


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_the_workflow_is_valid_for_github_actions(workflow):
    r = lint(str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(workflow))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_the_workflow_passes_zizmors_audits(workflow):
    """Pinned actions, no template injection, no persisted credentials, least permissions."""
    r = lint(str(BIN / "zizmor"), "--offline", "--no-progress", str(workflow))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_workflow_builds_with_the_script_the_docs_give_admins():
    """One set of steps: the workflow's build is scripts/release-images, which
    docs/admin.md tells an admin to run by hand; both name the same tags."""
    workflow = (REPO / ".github" / "workflows" / "release.yml").read_text()
    admin = (REPO / "docs" / "admin.md").read_text()
    script = (REPO / "scripts" / "release-images").read_text()
    assert 'scripts/release-images "$PREFIX"' in workflow
    assert "target: [hub, notebook]" in workflow and 'tags: ["v[0-9]+.[0-9]+.[0-9]+*"]' in workflow
    assert "scripts/release-images <registry>/<team>" in admin
    assert "--platform linux/amd64" in script
    assert '"$image:$version"' in script and '"$image:${version%.*}" "$image:latest"' in script


def test_the_script_says_what_is_valid_when_called_wrong(tmp_path):
    r = lint("bash", str(REPO / "scripts" / "release-images"))
    assert r.returncode == 2 and r.stderr.strip() == "usage: scripts/release-images PREFIX   (e.g. <registry>/<team>)"
    r = subprocess.run(["bash", str(REPO / "scripts" / "release-images"), "x"], capture_output=True, text=True,
                       timeout=60, cwd=REPO, env={"PATH": "/usr/bin:/bin", "PDL_TARGETS": "gpu"})
    assert r.returncode == 2 and "unknown target 'gpu' (hub or notebook)" in r.stderr
