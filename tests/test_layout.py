"""The product's packages keep their layout rules: no import circle, no import running
back up the packages' layers, and no module imports another module's ``_private`` name
(each concept is used through its owner's public API). Read from the source with :mod:`ast`, imports inside functions included.
The tests mirror the code on one axis, the part of the code a test guards: each cluster
kind other than the embedded default has its folder (``swarm/``, ``slurm/``), which
holds every test that exists because of that kind, unit and integration, on whichever
side its code runs; every other test lives in the folder of its side: ``hub/`` (the
spawner core and the local kind), ``server/`` (the user's server, ``pdl_server``),
``notebook/``, ``engines/``, ``training/``, ``browser/`` (this file, about the whole
tree, aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # read from the source: no process started

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pdl", "pdl_server", "pdl_magics", "pdl_spawner", "pdl_lab", "pdl_cinic10")
#: tests/<side>/: the tests of one side of the code; tests/harness/: what they share.
TEST_SIDES = ("hub", "server", "notebook", "engines", "training", "swarm", "slurm", "browser")
#: A cluster kind's folder, and the modules that exist only for that kind.
KIND_MODULES = {"swarm": ("pdl_spawner.swarm",),
                "slurm": ("pdl_spawner.slurm",)}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def imports(name: str, path: Path) -> list[tuple[str, str]]:
    """(module imported, name imported or "") for every import statement of a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((submodule, "") if submodule in MODULES else (base, alias.name))
    return found


def test_the_layout_rules_see_every_package():
    assert {name.split(".")[0] for name in MODULES} == set(PACKAGES)
    assert "pdl_magics.session" in MODULES and "pdl.runtime.engine" in MODULES


def test_no_product_module_imports_a_private_name_of_another():
    offenders = [
        f"{name} imports {base}.{what}"
        for name, path in MODULES.items()
        for base, what in imports(name, path)
        if base in MODULES and base != name and what.startswith("_") and not what.startswith("__")
    ]
    assert offenders == []


def test_there_is_no_import_circle_among_the_product_modules():
    graph = {name: {base for base, _ in imports(name, path) if base in MODULES and base != name}
             for name, path in MODULES.items()}
    circles = []

    def visit(name, trail):
        if name in trail:
            circles.append(" -> ".join(trail[trail.index(name):] + [name]))
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            if not (target.startswith(name + ".") or name.startswith(target + ".")):  # a package and its own modules
                visit(target, trail + [name])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        visit(name, [])
    assert circles == []


#: The packages in layers, lowest first: the shared floor; the user's server (and the
#: training recipe, which needs only the floor); the notebook side and the Cluster panel,
#: both on the server's; the hub side on top, where a kind may reach any of them.
LAYERS = (("pdl",), ("pdl_server", "pdl_cinic10"), ("pdl_magics", "pdl_lab"), ("pdl_spawner",))


def layer(package: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if package in names)


def test_the_layers_name_every_package_once():
    assert sorted(p for names in LAYERS for p in names) == sorted(PACKAGES)


def test_no_import_runs_back_up_or_across_a_layer():
    """A module imports its own package's modules and those of lower layers only: the
    floor nothing of the others, the server nothing of the notebook side, and so on."""
    offenders = sorted(
        f"{name} imports {base}"
        for name, path in MODULES.items()
        for base, _ in imports(name, path)
        if base.split(".")[0] in PACKAGES and base.split(".")[0] != name.split(".")[0]
        and layer(base.split(".")[0]) >= layer(name.split(".")[0])
    )
    assert offenders == []


SUBPACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_package_docstring_names_every_module_it_holds(package):
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    held = [name for name in MODULES if name.rpartition(".")[0] == package]
    assert held and [name for name in held if name not in doc] == [], f"{package}/__init__.py does not say what these hold"


#: The tests of the whole repository, beside tests/<side>/: this one, and the docs' references.
REPOSITORY_TESTS = (Path("test_layout.py"), Path("test_doc_references.py"), Path("test_suite_report.py"))


def test_every_test_file_lives_in_the_folder_of_its_side():
    tests = ROOT / "tests"
    files = sorted(path.relative_to(tests) for path in tests.rglob("test_*.py"))
    astray = [str(path) for path in files
              if path not in REPOSITORY_TESTS and (len(path.parts) != 2 or path.parts[0] not in TEST_SIDES)]
    assert astray == [], f"test files outside tests/<side>/ ({', '.join(TEST_SIDES)})"
    # pytest imports them by basename (no __init__.py, its default import mode): one name, one file
    names = [path.name for path in files]
    assert sorted({name for name in names if names.count(name) > 1}) == []
    assert not list(tests.rglob("__init__.py"))
    folders = [path.name for path in tests.iterdir() if path.is_dir() and not path.name.startswith((".", "__"))]
    assert sorted(folders) == sorted([*TEST_SIDES, "harness"])


#: The cluster kinds besides the embedded default (whose name, "local", is a common word):
#: the folders of pdl_spawner that hold a kind's plug-in.
OTHER_KINDS = sorted(p.parent.name for p in (ROOT / "pdl_spawner").glob("*/kind.py") if p.parent.name != "local")


def names_in(path: Path) -> list[str]:
    """The identifiers and short string constants of a module (not its docstrings or
    comments, which may speak of anything)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(node.name)
        elif isinstance(node, ast.arg):
            found.append(node.arg)
        elif isinstance(node, ast.alias):
            found.append(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and len(node.value) < 60:
            found.append(node.value)
    return found


def test_no_module_outside_a_kinds_folder_names_a_kind():
    """Guards the kinds as plug-ins (pdl_spawner/kinds.py): the hub's config, the admin
    view, the user's server and the engines pick a kind by its name and never branch on
    one, so a new kind adds one folder. A kind's name appears in code only inside its
    own folder, pdl_spawner/<kind>/."""
    assert OTHER_KINDS == ["slurm", "swarm"]
    offenders = sorted(
        f"{name}: {word!r}"
        for name, path in MODULES.items()
        if not any(name == f"pdl_spawner.{kind}" or name.startswith(f"pdl_spawner.{kind}.") for kind in OTHER_KINDS)
        for word in set(names_in(path)) if any(kind in word.lower() for kind in OTHER_KINDS)
    )
    assert offenders == []


#: Where code outside the engine runtime may import it: the engine processes' entry
#: points (a kind's ``engine_boot``) and the one function the notebook side ships to
#: engines, whose body runs there.
RUNTIME_DOORS = ("pdl_server.world.call_engine",)


def runtime_imports(name: str, path: Path) -> list[str]:
    """Where a module imports :mod:`pdl.runtime`: ``<module>`` at its top level,
    ``<module>.<function>`` inside a function (the outermost one)."""
    found = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            inner = f"{name}.{child.name}" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and where == name else where
            if isinstance(child, ast.Import) and any(a.name == "pdl.runtime" or a.name.startswith("pdl.runtime.") for a in child.names):
                found.append(where)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").split(".")[:2] == ["pdl", "runtime"]:
                found.append(where)
            elif isinstance(child, ast.ImportFrom) and child.module == "pdl" and any(a.name == "runtime" for a in child.names):
                found.append(where)
            visit(child, inner)

    visit(ast.parse(path.read_text()), name)
    return found


def test_only_engines_import_the_engine_runtime():
    """pdl.runtime runs inside engines only: the hub, the user's server, the kernel and
    the panel reach it through the engines (``call_engine``), and what they share with
    it (the data a rank publishes, the process helpers) lives in the floor."""
    offenders = sorted(
        where for name, path in MODULES.items()
        if not name.startswith("pdl.runtime") and not name.endswith(".engine_boot")
        for where in runtime_imports(name, path) if where not in RUNTIME_DOORS)
    assert offenders == []
    assert runtime_imports("pdl_server.world", MODULES["pdl_server.world"]) == ["pdl_server.world.call_engine"]


def test_a_test_of_a_kinds_code_lives_in_that_kinds_folder():
    """Guards the axis: a test that imports a module of one cluster kind is in its folder."""
    tests = ROOT / "tests"
    astray = []
    for path in sorted(tests.glob("*/test_*.py")):
        used = {base for base, _ in imports(path.stem, path)} | {f"{base}.{what}" for base, what in imports(path.stem, path)}
        for kind, prefixes in KIND_MODULES.items():
            if path.parent.name != kind and any(u == p or u.startswith(p + ".") for u in used for p in prefixes):
                astray.append(f"{path.relative_to(tests)} uses the {kind} kind")
    assert astray == []


def test_the_processes_get_the_machine_wide_groups_then_the_longest_first():
    """Guards the groups' order (harness/worker_groups.py): a long group handed out last
    would run alone at the end while the other processes wait."""
    import worker_groups

    seconds = {"tests/hub/test_short.py": 5, "tests/hub/test_long.py": 50, "tests/slurm/": 10, "tests/swarm/": 20}
    groups = ["tests/hub/test_short.py", "tests/slurm/", "tests/hub/test_new.py", "tests/hub/test_long.py",
              "tests/swarm/"]
    assert worker_groups.group_order(groups, seconds) == [
        "tests/swarm/", "tests/slurm/", "tests/hub/test_long.py", "tests/hub/test_new.py", "tests/hub/test_short.py"]
    assert worker_groups.worker_group("tests/swarm/test_x.py::test_y") == "tests/swarm/"
    assert worker_groups.worker_group("tests/hub/test_x.py::test_y[1]") == "tests/hub/test_x.py"
    recorded = worker_groups.group_seconds()
    assert recorded["tests/swarm/"] > 0 and all(Path(ROOT / group).exists() for group in recorded), recorded


def test_a_session_never_removes_the_folders_of_a_session_still_running(tmp_path):
    """Guards harness/session_tmp.py: pytest's own numbering removed a running session's
    folders when another session started beside it (a hub's homes went, its tests failed)."""
    import subprocess
    import sys

    from session_tmp import KEPT_ENDED, session_basetemp

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs = session_basetemp(tmp_path, running.pid)
        (theirs.parent / "homes").mkdir()
        ended = []
        for _ in range(KEPT_ENDED + 2):  # sessions that ended: their pid is gone
            gone = subprocess.Popen([sys.executable, "-c", "pass"])
            gone.wait()
            ended.append(session_basetemp(tmp_path, gone.pid).parent)
        mine = session_basetemp(tmp_path)
        assert (theirs.parent / "homes").is_dir() and mine.parent.is_dir()
        assert [folder.exists() for folder in ended] == [False] * 2 + [True] * KEPT_ENDED
    finally:
        running.kill()
        running.wait()
