"""Print PDL's requirements from pyproject.toml, one per line, for the image builds.

Usage: python requirements.py PYPROJECT [--extra NAME ...] [--exclude NAME ...]
       python requirements.py PYPROJECT --build-system

The Dockerfile installs these in layers of their own, before the project itself, so
that a code change reuses them, and rebuilds them only when these lists change.
``--exclude`` drops packages by name (the hub image leaves out torch: the hub never
imports it). ``--build-system`` prints ``[build-system].requires`` instead (for the
stage that builds PDL's wheel).
"""

from __future__ import annotations

import argparse
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def _name(requirement: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("pyproject")
    p.add_argument("--extra", action="append", default=[])
    p.add_argument("--exclude", action="append", default=[])
    p.add_argument("--build-system", action="store_true")
    a = p.parse_args(argv)
    with open(a.pyproject, "rb") as f:
        data = tomllib.load(f)
    if a.build_system:
        reqs = list(data.get("build-system", {}).get("requires", []))
    else:
        reqs = list(data["project"].get("dependencies", []))
        extras = data["project"].get("optional-dependencies", {})
        for extra in a.extra:
            if extra not in extras:
                print(f"requirements.py: no extra {extra!r} in {a.pyproject}", file=sys.stderr)
            reqs += extras.get(extra, [])
    excluded = {_name(n) for names in a.exclude for n in names.replace(",", " ").split()}
    for r in reqs:
        if _name(r) not in excluded:
            print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
