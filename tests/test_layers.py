"""The architecture rules import-linter's contracts cannot state, checked on the source.

Which layer may import which is in pyproject.toml's ``[tool.importlinter]`` contracts (CI runs
``lint-imports``; docs/architecture.md lists them). Here: no import cycle among kvprof's
modules, no private name imported across packages, and only the run directory spells a run's
file names. Every import counts, at the top, inside a function or under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "kvprof"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_private_name_is_imported_from_another_package() -> None:
    """``from kvprof.x.y import _name`` only within kvprof.x (a private name is not a seam)."""
    found = []
    for f in sorted(PKG.rglob("*.py")):
        mod = _module(f)
        own = mod.rsplit(".", 1)[0] if f.name != "__init__.py" else mod
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvprof"):
                target_pkg = node.module.rsplit(".", 1)[0]
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__") and target_pkg != own \
                            and not node.module.startswith(own + "."):
                        found.append(f"{f.relative_to(PKG.parent)}:{node.lineno} imports {node.module}.{a.name}")
    assert found == []


# A run's file names, as only kvprof/core/rundir.py may spell them in code (docstrings and
# comments may name the files they describe).
RUN_FILE_NAMES = ("manifest.json", "summary.json", "summary.csv", "events.parquet", "writes.parquet",
                  "step_timings.json", "step_timings.rank", ".pt.trace.json", "kvprof-sglang.", "compare.json",
                  ".ranks-config", ".ranks-store", ".child-spec", ".child-result", "bench.json", "bench.csv")
# spelled as a whole string: the manifest's key of the timings file and the nsys child's result's
RUN_FILE_KEYS = ("hta", "step_timings")
# the suffixes of nsys's files: a name (no space) that ends in one is suffix surgery ("prof.sqlite",
# name[: -len(".nsys-rep")]); a sentence may say ".sqlite export"
RUN_FILE_SUFFIXES = (".nsys-rep", ".qdrep", ".qdstrm", ".sqlite")


def _run_file_literals(root: Path) -> list[str]:
    found = []
    for f in sorted(root.rglob("*.py")):
        if f.relative_to(root).as_posix() == "core/rundir.py":
            continue
        tree = ast.parse(f.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                v = node.value
                hits = ([n for n in RUN_FILE_NAMES if n in v] + [k for k in RUN_FILE_KEYS if v == k]
                        + [x for x in RUN_FILE_SUFFIXES if v.endswith(x) and not any(c.isspace() for c in v)])
                if hits:
                    found.append(f"{f.relative_to(root.parent)}:{node.lineno} spells {', '.join(hits)}")
    return found


def test_only_the_run_directory_spells_a_runs_file_names(tmp_path: Path) -> None:
    """kvprof.core.rundir.RunDir owns the run folder's layout; everything else asks it for a path."""
    assert _run_file_literals(PKG) == []
    planted = tmp_path / "kvprof"
    (planted / "core").mkdir(parents=True)
    (planted / "core" / "rundir.py").write_text('SUMMARY = "summary.json"\n')
    (planted / "x.py").write_text('"""Reads summary.json."""\nNAME = f"{v}.pt.trace.json.gz"\nHTA = "hta"\n')
    # what the bench, nsys and capture modules spelled: names, a key, suffix surgery; a sentence is not one
    (planted / "y.py").write_text(
        'A = out / "bench.json"\nB = f"wrote {out / \'bench.csv\'}"\nK = child.get("step_timings")\n'
        'C = name[: -len(".nsys-rep")]\nD = f"{base}.sqlite"\nE = base.with_name(base.name + ".qdstrm")\n'
        'OK = ("pass the exported .sqlite (nsys export)", ".sqlite3", "kvprof.step_timings/1")\n')
    assert sorted(line.split(" spells ")[1] for line in _run_file_literals(planted)) == [
        ".nsys-rep", ".pt.trace.json", ".qdstrm", ".sqlite", "bench.csv", "bench.json", "hta", "step_timings"]


def _cycles(package: str) -> list[str]:
    """Each import that closes a cycle among the package's modules, with the way back: every
    import counts (at the top, inside a function, under TYPE_CHECKING)."""
    # a dev dependency (CI installs it); a machine without it skips only the cycle checks
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(package, include_external_packages=False, cache_dir=None)
    found = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                found.append(f"{module} -> {' -> '.join(back)}")
    return found


def test_no_import_cycle_among_kvprofs_modules() -> None:
    assert _cycles("kvprof") == []


def test_the_cycle_search_sees_a_lazy_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from cyclic import high\n")
    (pkg / "high.py").write_text("from cyclic import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles("cyclic") == ["cyclic.high -> cyclic.low -> cyclic.high", "cyclic.low -> cyclic.high -> cyclic.low"]


# -- the torch side's own stack (pyproject.toml's kvprof.kvcache layers contract) -----------------

KVCACHE = PKG / "kvcache"


def _kvcache_layers() -> list[list[str]]:
    """The kvprof.kvcache layers contract, bottom first, each layer's module names."""
    import tomllib

    doc = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    contracts = [c for c in doc["tool"]["importlinter"]["contracts"] if c.get("containers") == ["kvprof.kvcache"]]
    assert len(contracts) == 1 and contracts[0]["type"] == "layers"
    return [[m.strip() for m in layer.split("|")] for layer in reversed(contracts[0]["layers"])]


def _upward_imports(package_dir: Path, package: str, layers: list[list[str]]) -> list[str]:
    """Each import (at the top, inside a function, under TYPE_CHECKING) from a layer of
    ``package`` into a higher one or into an independent sibling of its own layer."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(package.split(".")[0], include_external_packages=False, cache_dir=None)
    place = {name: (i, name) for i, layer in enumerate(layers) for name in layer}
    found = []
    for module in sorted(m for m in graph.modules if m.startswith(package + ".")):
        own = place.get(module[len(package) + 1:].split(".")[0])
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith(package + ".") or own is None:
                continue
            other = place.get(imported[len(package) + 1:].split(".")[0])
            if other is not None and (other[0] > own[0] or (other[0] == own[0] and other[1] != own[1])):
                found.append(f"{module} -> {imported}")
    return found


def test_every_torch_side_module_has_a_place_in_its_stack() -> None:
    """A new module of kvprof/kvcache is placed in the layers contract, or this fails (a module
    outside every layer would be checked by nothing)."""
    placed = {name for layer in _kvcache_layers() for name in layer}
    present = {p.stem for p in KVCACHE.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in KVCACHE.iterdir() if (p / "__init__.py").exists()}
    assert present == placed


def test_the_torch_side_imports_nothing_above_itself() -> None:
    """Contracts below the registry below the writers below the layouts below the pools and
    instrumentation: no import goes up, function-level and TYPE_CHECKING ones included."""
    assert _upward_imports(KVCACHE, "kvprof.kvcache", _kvcache_layers()) == []


def test_the_upward_import_search_sees_a_lazy_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "stacked"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "base.py").write_text("def f():\n    from stacked import high\n")
    (pkg / "high.py").write_text("from stacked.low import base\n")
    (pkg / "side.py").write_text("import stacked.high\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    layers = [["low"], ["high", "side"]]
    assert _upward_imports(pkg, "stacked", layers) == ["stacked.low.base -> stacked.high",
                                                       "stacked.side -> stacked.high"]


def _string_imports(root: Path, allowed: tuple[str, ...]) -> list[str]:
    """Each ``import_module``/``__import__`` under ``root`` (outside the files ``allowed``) whose
    name is not a literal, or a module-level string constant, naming a module outside kvprof."""
    found = []
    for f in sorted(root.rglob("*.py")):
        if f.relative_to(root).as_posix() in allowed:
            continue
        tree = ast.parse(f.read_text())
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if func is None or getattr(func, "attr", getattr(func, "id", "")) not in ("import_module", "__import__"):
                continue
            arg = node.args[0] if node.args else None
            name = arg.value if isinstance(arg, ast.Constant) else constants.get(arg.id) if isinstance(
                arg, ast.Name) else None
            if not isinstance(name, str) or name.split(".")[0] == "kvprof":
                found.append(f"{f.relative_to(root.parent)}:{node.lineno} imports {ast.unparse(arg) if arg else '?'}")
    return found


def test_the_torch_side_imports_no_kvprof_module_by_a_string(tmp_path: Path) -> None:
    """No module of kvprof/kvcache loads a kvprof module by name (an import the graph cannot
    see), save the writers package, which registers its own writers from the variant table's
    ``module:factory`` into the registry below it and loads each when first built, and the
    registry, which loads what a user names (``--writer module:function``, entry points); the
    layouts register themselves from above (``register_layout``) instead of being loaded by name."""
    allowed = ("registry.py", "writers/__init__.py")
    assert _string_imports(KVCACHE, allowed) == []
    planted = tmp_path / "kvcache"
    planted.mkdir()
    (planted / "registry.py").write_text("import importlib\nimportlib.import_module(spec)\n")
    (planted / "layout.py").write_text('import importlib\n_MODULES = {"mha": "kvprof.kvcache.layouts.mha"}\n'
                                       'importlib.import_module(_MODULES[name])\n')
    (planted / "ok.py").write_text('import importlib\nSGL = "sglang.srt"\nimportlib.import_module(SGL)\n'
                                   'importlib.import_module("triton")\n__import__(f"kvprof.{x}")\n')
    assert _string_imports(planted, allowed) == ["kvcache/layout.py:3 imports _MODULES[name]",
                                                       "kvcache/ok.py:5 imports f'kvprof.{x}'"]
