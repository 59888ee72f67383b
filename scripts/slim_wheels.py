"""Leave out of three of the bundle's wheels what the GPU check never uses, so the bundle
fits the GPU machine's copy limit (``scripts/gpu-bundle`` runs it).

    python scripts/slim_wheels.py WHEELS_DIR

- ``cmake``: only the ``cmake`` program and its modules and templates stay; ``ctest``,
  ``cpack``, the HTML help and the editor files go (29 MiB -> about 10). Horovod's build
  runs ``cmake`` alone.
- ``jupyterhub``: of ``static/components`` (62 MiB of third-party web files, most of them
  Font Awesome's 42 MiB) only the files the hub's pages load stay: those its templates,
  scripts and style sheets name, and the fonts those style sheets name (15 MiB -> about 1).
- ``jedi`` (IPython's code completion): the type stubs of the standard library and
  Django it completes from go (4.7 MiB -> about 0.2); the check completes no code.

Each wheel is unpacked and packed again with the ``wheel`` tool, which writes a new
``RECORD``; its name and version stay. One line per wheel says what it weighed before
and after. A wheel missing from WHEELS_DIR is an error.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

MIB = 1 << 20
#: cmake's files the GPU check does without: other programs, help pages, editor modes.
CMAKE_UNUSED = re.compile(r"^cmake/data/(bin/(ctest|cpack|ccmake)$|doc/|share/(cmake-[^/]+/Help|vim|emacs|"
                          r"bash-completion|aclocal)/)")
#: jedi's files the GPU check does without: the stubs it infers completions from.
JEDI_UNUSED = re.compile(r"^jedi/third_party/")
#: A path under ``static/`` that a page, script or style sheet names ("components/...").
COMPONENT_REF = re.compile(r"components/[\w@.\-/]+")
#: A relative ``url(...)`` in a style sheet (a font).
CSS_URL = re.compile(r"url\(\s*[\"']?([^\"')?#]+)")


def all_but(unused: re.Pattern) -> Callable[[Path, list[str]], set[str]]:
    """A wheel's files that stay: all but those ``unused`` matches."""
    return lambda _root, files: {f for f in files if not unused.match(f)}


def jupyterhub_keeps(root: Path, files: list[str]) -> set[str]:
    """The jupyterhub wheel's files that stay (paths relative to the unpacked ``root``):
    everything outside ``static/components/``, and inside it the files named by the
    templates, the hub's own scripts and style sheets (a require.js path without its
    ``.js`` counts), plus the files those named style sheets point at with ``url()``."""
    static = next(f for f in files if f.endswith("/static/favicon.ico")).rsplit("/", 1)[0]
    components = f"{static}/components/"
    own = [f for f in files if not f.startswith(components) and f.endswith((".html", ".js", ".css"))]
    named = {f"{static}/{ref}" for f in own for ref in COMPONENT_REF.findall((root / f).read_text(errors="replace"))}
    kept = {f for f in files if f in named or (f.endswith(".js") and f[:-3] in named)}
    for sheet in [f for f in kept if f.endswith(".css")]:
        folder = sheet.rsplit("/", 1)[0]
        refs = CSS_URL.findall((root / sheet).read_text(errors="replace"))
        kept |= {posixpath.normpath(f"{folder}/{ref}") for ref in refs}
    return {f for f in files if not f.startswith(components)} | (kept & set(files))


def slim(wheel: Path, keeps: Callable[[Path, list[str]], set[str]]) -> tuple[int, int]:
    """Repack ``wheel`` in place with only the files ``keeps(root, files)`` returns;
    (bytes before, bytes after)."""
    before = wheel.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "wheel", "unpack", "-d", tmp, str(wheel)], check=True,
                       capture_output=True)
        root = next(Path(tmp).iterdir())
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        kept = keeps(root, files)
        for name in files:
            if name not in kept and ".dist-info/" not in name:
                (root / name).unlink()
        packed = Path(tmp) / "packed"
        packed.mkdir()
        subprocess.run([sys.executable, "-m", "wheel", "pack", "-d", str(packed), str(root)], check=True,
                       capture_output=True)
        shutil.move(next(packed.iterdir()), wheel)
    return before, wheel.stat().st_size


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python scripts/slim_wheels.py WHEELS_DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    for name, keeps in (("cmake", all_but(CMAKE_UNUSED)), ("jupyterhub", jupyterhub_keeps),
                        ("jedi", all_but(JEDI_UNUSED))):
        found = sorted(folder.glob(f"{name}-*.whl"))
        if len(found) != 1:
            print(f"slim_wheels: expected one {name} wheel in {folder}, found {len(found)}", file=sys.stderr)
            return 1
        before, after = slim(found[0], keeps)
        print(f"slim_wheels: {found[0].name}: {before / MIB:.1f} -> {after / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
