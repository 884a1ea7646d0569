"""The architecture rules import-linter's contracts cannot state, checked on the source.

Which layer may import which is in pyproject.toml's ``[tool.importlinter]`` contracts (CI runs
``lint-imports``; docs/architecture.md lists them). Here, on grimp's graph plus an edge for every
module kvprof loads by a name: no import cycle, no edge up either stack, every contract kept.
Every import counts, at the top, inside a function or under TYPE_CHECKING. And: no private name
imported across packages, only the run directory spells a run's file names, and only the
command line spells a ``--flag``.
"""

from __future__ import annotations

import ast
import copy
import functools
import re
from pathlib import Path
from typing import Any

import pytest

PKG = Path(__file__).resolve().parent.parent / "kvprof"


def _module(path: Path, root: Path = PKG) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
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
        docs = _docstrings(tree)
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


# -- the import graph: grimp's, and every module kvprof loads by a name ---------------------------
#
# grimp sees every import statement, function-level and TYPE_CHECKING ones included; a module
# loaded by its name (importlib.import_module, __import__, ``python -m``, importlib.resources, a
# ``"module:factory"`` the variant table or an entry point gives) is an import it cannot see. Each
# such name is an edge here, from the module holding the string to the module it names, and the
# cycle and layer checks below run on grimp's graph with these edges added.

PYPROJECT = PKG.parent / "pyproject.toml"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of a tree's docstring nodes (text about the code, not code)."""
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _called(node: ast.Call) -> str:
    return getattr(node.func, "attr", getattr(node.func, "id", ""))


def _string_edges(root: Path, modules: set[str]) -> list[tuple[str, str, str]]:
    """(module holding the string, module it names, where) for each string in the code under
    ``root`` that names one of ``modules``: the whole string is a module (``"pkg.mod"``: what
    import_module, ``python -m`` and importlib.resources take) or a module and an attribute
    (``"pkg.mod:Factory"``), an edge to that module; or a package and a dot (``"pkg.views."``, the
    head of an f-string or a sum that appends a name), an edge to every module under it.

    Not a docstring, nor the name given to logging.getLogger (a logger's name: nothing is
    loaded). The root package alone is no edge: "kvprof" is the program's name in many strings,
    and the root's __init__ imports nothing (test_kvprofs_root_module_imports_nothing)."""
    found = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text())
        skip = _docstrings(tree) | {id(n.args[0]) for n in ast.walk(tree)
                                    if isinstance(n, ast.Call) and n.args and _called(n) == "getLogger"}
        holder = _module(f, root)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
                continue
            text, where = node.value, f"{f.relative_to(root.parent)}:{node.lineno}"
            name = text.partition(":")[0]
            if name in modules and name != root.name:
                found.append((holder, name, where))
            elif text.endswith(".") and text[:-1] in modules:
                found += [(holder, m, where) for m in sorted(modules) if m.startswith(text)]
    return found


# Strings one module only stores as data and another turns into imports: the edge is the
# resolver's. holder -> (resolver, the one function the resolver reads them through, why);
# test_a_stored_name_is_resolved_only_where_its_edge_is_drawn checks the function and the field.
RESOLVED_BY = {
    "kvprof.core.variants": (
        "kvprof.kvcache.writers", "builtin_writers",
        # the variant table is torch-free data that the analysis, the reports and the dashboard read
        # without importing a writer: it stores each writer's factory="module:Class" (VariantInfo.factory,
        # read only by builtin_writers()); kvprof/kvcache/writers/__init__.py alone turns them into
        # imports (builtin(): the module is imported when the writer is first built)
        "the variant table's factories are imported by the writers package"),
}

# kvprof's own entry-point groups (a group and its sub-groups, "kvprof.writers.mla") and the module
# that loads each: a kvprof module pyproject.toml registers in one is an edge from that loader (no
# module of kvprof holds the string). The other groups, SGLang's and vLLM's plugins, and
# [project.scripts] are loaded by another program, which starts at the named module: no module of
# kvprof imports it by that name.
ENTRY_POINT_LOADERS = {"kvprof.writers": "kvprof.kvcache.registry", "kvprof.trace_readers": "kvprof.core.readers"}


def _entry_point_edges(pyproject: Path, modules: set[str]) -> list[tuple[str, str, str]]:
    import tomllib

    found = []
    for group, points in tomllib.loads(pyproject.read_text())["project"].get("entry-points", {}).items():
        loader = next((m for g, m in ENTRY_POINT_LOADERS.items() if group == g or group.startswith(g + ".")), None)
        assert loader is not None or not group.startswith("kvprof"), f"{group}: which module of kvprof loads it?"
        for value in points.values():
            if loader is not None and value.partition(":")[0].strip() in modules:
                found.append((loader, value.partition(":")[0].strip(), f"{pyproject.name} [{group}]"))
    return found


def _load_edges(root: Path, modules: set[str], pyproject: Path | None = None,
                resolved: dict[str, tuple[str, str, str]] | None = None) -> list[tuple[str, str, str]]:
    """Every edge a name makes, each string's at its resolver (``RESOLVED_BY``) where it has one."""
    resolved = RESOLVED_BY if resolved is None else resolved
    edges = [(resolved[h][0] if h in resolved else h, n, w) for h, n, w in _string_edges(root, modules)]
    return edges + (_entry_point_edges(pyproject, modules) if pyproject is not None else [])


def _graph(root: Path, *, pyproject: Path | None = None, resolved: dict[str, tuple[str, str, str]] | None = None,
           externals: bool = False) -> Any:
    """grimp's graph of the package at ``root`` (every import statement) with the edges of
    ``_load_edges`` added."""
    # a dev dependency (CI installs it); a machine without it skips only the graph checks
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(root.name, include_external_packages=externals, cache_dir=None)
    modules = {m for m in graph.modules if m == root.name or m.startswith(root.name + ".")}
    for holder, named, _ in _load_edges(root, modules, pyproject, resolved):
        if holder != named:
            graph.add_import(importer=holder, imported=named)
    return graph


@functools.cache
def _kvprof_graph() -> Any:
    """kvprof's graph, the names it loads included; external packages as nodes (the contract on
    torch names one)."""
    return _graph(PKG, pyproject=PYPROJECT, externals=True)


def _cycles(graph: Any, package: str) -> list[str]:
    """Each import that closes a cycle among the package's modules, with the way back."""
    found = []
    for module in sorted(m for m in graph.modules if m == package or m.startswith(package + ".")):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                found.append(f"{module} -> {' -> '.join(back)}")
    return found


def test_no_import_cycle_among_kvprofs_modules() -> None:
    """Every import counts (at the top, inside a function, under TYPE_CHECKING), and so does every
    module loaded by a name."""
    assert _cycles(_kvprof_graph(), "kvprof") == []


def test_the_cycle_search_sees_a_lazy_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from cyclic import high\n")
    (pkg / "high.py").write_text("from cyclic import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(_graph(pkg), "cyclic") == ["cyclic.high -> cyclic.low -> cyclic.high",
                                              "cyclic.low -> cyclic.high -> cyclic.low"]


def test_the_cycle_search_sees_a_cycle_through_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No import statement closes the cycle: a module loads the one above it by its name."""
    pkg = tmp_path / "strung"
    (pkg / "pages").mkdir(parents=True)
    for f in ("__init__.py", "pages/__init__.py", "pages/one.py", "plugin.py"):
        (pkg / f).write_text("")
    (pkg / "low.py").write_text(
        '"""Loads strung.high by name."""\nimport importlib\nimport logging\n\nlog = logging.getLogger("strung.high")\n'
        'def f():\n    return importlib.import_module("strung.high")\n')
    (pkg / "high.py").write_text("from strung import low\n")
    (pkg / "table.py").write_text('FACTORY = "strung.plugin:Make"\ndef page(n):\n    return f"strung.pages.{n}"\n')
    (pkg / "loader.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = _graph(pkg)
    assert _cycles(graph, "strung") == ["strung.high -> strung.low -> strung.high",
                                        "strung.low -> strung.high -> strung.low"]
    modules = set(graph.modules)
    # the docstring and the logger's name are no edge; the factory and the f-string's package are
    assert sorted((h, n) for h, n, _ in _string_edges(pkg, modules)) == [
        ("strung.low", "strung.high"), ("strung.table", "strung.pages.one"), ("strung.table", "strung.plugin")]
    # a stored name is drawn at its resolver
    resolved = {"strung.table": ("strung.loader", "", "")}
    assert sorted((h, n) for h, n, _ in _load_edges(pkg, modules, resolved=resolved)) == [
        ("strung.loader", "strung.pages.one"), ("strung.loader", "strung.plugin"), ("strung.low", "strung.high")]


def test_kvprofs_root_module_imports_nothing() -> None:
    """kvprof/__init__.py holds __version__ only, so the strings naming the root package alone
    ("kvprof", the program's name) need no edge."""
    assert _kvprof_graph().find_modules_directly_imported_by("kvprof") == set()


def test_a_stored_name_is_resolved_only_where_its_edge_is_drawn() -> None:
    """The variant table's factories are read through one function, called by the writers package
    alone: the edge drawn from the writers package is the import that happens."""
    for holder, (resolver, reader, _) in RESOLVED_BY.items():
        readers, readers_of_factory = set(), set()
        for f in sorted(PKG.rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Name) and node.id == reader) or (
                        isinstance(node, ast.Attribute) and node.attr == reader):
                    readers.add(_module(f))
                if isinstance(node, ast.Attribute) and node.attr == "factory":
                    readers_of_factory.add(_module(f))
        assert readers == {resolver}, f"{holder}'s names are read through {reader} by {sorted(readers)}"
        assert readers_of_factory == {holder}, f"VariantInfo.factory is read in {sorted(readers_of_factory)}"


def test_each_entry_point_group_is_loaded_where_the_edges_say() -> None:
    """The module named in ENTRY_POINT_LOADERS is the one that spells the group."""
    for group, loader in ENTRY_POINT_LOADERS.items():
        path = PKG.parent / (loader.replace(".", "/") + ".py")
        spelled = {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}
        assert group in spelled, f"{loader} does not name the entry-point group {group}"


def test_kvprofs_names_are_edges_of_the_graph() -> None:
    """What the search finds in kvprof: the command modules, the child processes, the dashboard's
    pages, the renderers' result types and the variant table's writers (at the writers package)."""
    graph = _kvprof_graph()
    modules = {m for m in graph.modules if m.startswith("kvprof")}
    edges = {(h, n) for h, n, _ in _load_edges(PKG, modules, PYPROJECT)}
    expected = {("kvprof.cli", "kvprof.commands.capture"), ("kvprof.capture.nsys_pass", "kvprof.capture.child"),
                ("kvprof.capture.ranks", "kvprof.capture.rank_worker"),
                ("kvprof.dashboard.serve", "kvprof.dashboard.data"),
                ("kvprof.commands.dashboard", "kvprof.dashboard.serve"),
                ("kvprof.report.renderers", "kvprof.analysis.gate"),
                ("kvprof.kvcache.writers", "kvprof.kvcache.writers.index_put")}
    assert expected <= edges
    assert not any(h == "kvprof.core.variants" for h, _ in edges)
    assert all(graph.direct_import_exists(importer=h, imported=n) for h, n in edges if h != n)


# -- every contract of pyproject.toml, the names' edges included ----------------------------------

def _links(metadata: object) -> list[str]:
    """Every importer -> imported pair a contract's failure lists."""
    found: set[str] = set()

    def walk(x: object) -> None:
        if isinstance(x, dict):
            if "importer" in x and "imported" in x:
                found.add(f"{x['importer']} -> {x['imported']}")
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple, set, frozenset)):
            for v in x:
                walk(v)

    walk(metadata)
    return sorted(found)


def _broken_contracts(graph: Any) -> list[str]:
    """The [tool.importlinter] contracts that ``graph`` breaks, as import-linter checks them."""
    api = pytest.importorskip("importlinter.api")
    from importlinter.contracts.forbidden import ForbiddenContract
    from importlinter.contracts.layers import LayersContract

    config = api.read_configuration(str(PYPROJECT))
    kinds = {"layers": LayersContract, "forbidden": ForbiddenContract}
    broken = []
    for options in config["contracts_options"]:
        contract = kinds[options["type"]](name=options["name"], session_options=config["session_options"],
                                          contract_options=options)
        check = contract.check(copy.deepcopy(graph), verbose=False)
        if not check.kept:
            broken.append(f"{options['name']}: {', '.join(_links(check.metadata))}")
    return broken


def test_every_contract_holds_with_the_names_kvprof_loads() -> None:
    """``lint-imports`` sees the import statements; the same contracts hold with every name kvprof
    loads as an import too."""
    assert _broken_contracts(_kvprof_graph()) == []


def test_the_contract_check_sees_a_name_that_goes_up() -> None:
    """What the edges would break if the variant table's names were drawn where they are written
    (core), and if the device module still named the Triton writers above it."""
    graph = _graph(PKG, pyproject=PYPROJECT, resolved={}, externals=True)
    graph.add_import(importer="kvprof.kvcache.devinfo", imported="kvprof.kvcache.writers.triton_kernel")
    assert [b.split(":")[0] for b in _broken_contracts(graph)] == [
        "core imports nothing else of kvprof",
        "the torch-free layers never import kvprof's torch side or command-line code",
        "the torch-free layers never import torch, triton or sglang (analyze, compare, scrub start in seconds)",
        "the torch side is a one-way stack",
    ]


# -- no import goes up: kvprof's stack and the torch side's own ----------------------------------

KVCACHE = PKG / "kvcache"


def _layers(container: str) -> list[list[str]]:
    """The layers contract of ``container`` in pyproject.toml, bottom first, each layer's module
    names (``a | b``: independent siblings)."""
    import tomllib

    doc = tomllib.loads(PYPROJECT.read_text())
    contracts = [c for c in doc["tool"]["importlinter"]["contracts"] if c.get("containers") == [container]]
    assert len(contracts) == 1 and contracts[0]["type"] == "layers"
    return [[m.strip() for m in layer.split("|")] for layer in reversed(contracts[0]["layers"])]


def _upward_imports(graph: Any, package: str, layers: list[list[str]]) -> list[str]:
    """Each edge of ``graph`` from a layer of ``package`` into a higher one or into an independent
    sibling of its own layer."""
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
    placed = {name for layer in _layers("kvprof.kvcache") for name in layer}
    present = {p.stem for p in KVCACHE.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in KVCACHE.iterdir() if (p / "__init__.py").exists()}
    assert present == placed


def test_kvprof_imports_nothing_above_itself() -> None:
    """cli > commands > dashboard > api > report > analysis > trace > tools > core: no edge goes
    up, function-level and TYPE_CHECKING imports and the names kvprof loads included."""
    assert _upward_imports(_kvprof_graph(), "kvprof", _layers("kvprof")) == []


def test_the_torch_side_imports_nothing_above_itself() -> None:
    """Contracts below the registry below the writers below the layouts below the pools and
    instrumentation: no edge goes up, function-level and TYPE_CHECKING imports and the names
    kvprof loads included."""
    assert _upward_imports(_kvprof_graph(), "kvprof.kvcache", _layers("kvprof.kvcache")) == []


def test_the_upward_import_search_sees_a_lazy_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "stacked"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "base.py").write_text("def f():\n    from stacked import high\n")
    (pkg / "low" / "names.py").write_text('HIGH = "stacked.high:f"\n')  # a name, loaded by whoever reads it
    (pkg / "high.py").write_text("from stacked.low import base\n")
    (pkg / "side.py").write_text("import stacked.high\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    layers = [["low"], ["high", "side"]]
    assert _upward_imports(_graph(pkg), "stacked", layers) == [
        "stacked.low.base -> stacked.high", "stacked.low.names -> stacked.high", "stacked.side -> stacked.high"]


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


# Where kvprof loads a module by a name computed at run time (not a literal at the call, nor a
# module-level constant): where the name comes from, and so where the graph has its edge.
LOADS_A_COMPUTED_NAME = {
    "kvcache/writers/__init__.py": "the variant table's module:factory strings, drawn at this package (RESOLVED_BY)",
    "kvcache/registry.py": "a user's module:function spec and third parties' entry points: names from outside "
                           "kvprof's code (kvprof's own entry points in its groups are edges from here)",
    "capture/rank_worker.py": "the reader's module:qualname, made by the parent process from the function the "
                              "facade hands down (api.trace_events): a callback, not a module the capture names",
    "dashboard/serve.py": "page_modules(): names written in this module (edges to the data module and each page)",
    "integrations/sglang.py": "SGLang's modules, from the hook tables written in this module",
    "integrations/vllm.py": "vLLM's modules, from the hook tables written in this module",
}


def _computed_loads(root: Path) -> dict[str, list[str]]:
    """Per file under ``root``, each import_module/__import__ whose name is not written at the
    call: neither a literal, nor an f-string with literal text first, nor a module-level constant."""
    found: dict[str, list[str]] = {}
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text())
        constants = {t.id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _called(node) not in ("import_module", "__import__"):
                continue
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) or (isinstance(arg, ast.Name) and arg.id in constants)
                    or (isinstance(arg, ast.JoinedStr) and isinstance(arg.values[0], ast.Constant))):
                found.setdefault(f.relative_to(root).as_posix(), []).append(
                    f"{node.lineno}: {ast.unparse(arg) if arg else '?'}")
    return found


def test_every_load_by_a_computed_name_is_accounted_for(tmp_path: Path) -> None:
    """A name written as a string anywhere in kvprof is an edge where it is written (or at its
    resolver); a load whose name is computed is listed in LOADS_A_COMPUTED_NAME with where the
    name comes from, and nowhere else."""
    assert set(_computed_loads(PKG)) == set(LOADS_A_COMPUTED_NAME)
    planted = tmp_path / "kvprof"
    planted.mkdir()
    (planted / "a.py").write_text('import importlib\nMOD = "kvprof.b"\nimportlib.import_module(MOD)\n'
                                  'importlib.import_module(f"kvprof.pages.{n}")\n__import__(".".join(["kvprof", n]))\n')
    assert _computed_loads(planted) == {"a.py": ["5: '.'.join(['kvprof', n])"]}


# -- flags only in kvprof/commands ------------------------------------------------------------------
#
# A message from below kvprof/commands names a setting by its field (kvprof.core.errors.Setting) and
# the command line spells it as its flag (kvprof.commands.flag_namer), so no string in code outside
# the command line spells a `--flag`. Docstrings and comments may (they are about the code).

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

# The command line itself: kvprof/commands, and kvprof/cli.py, which builds the program's parser
# (``--version``) and argparse's one-line error (``see kvprof --help``).
COMMAND_LINE = ("commands/", "cli.py")

# Flags of other programs that kvprof runs, each where kvprof builds their command line:
# module -> (the flags, why). Each flag listed is spelled there (the test fails on a stale one).
OTHER_PROGRAMS = {
    "tools/nsys.py": (frozenset({
        "--sample", "--cpuctxsw", "--force-overwrite", "--export", "--capture-range-end", "--type", "--trace",
        "--cuda-graph-trace", "--capture-range", "--duration", "--output", "--version",
        "--pid", "--fork", "--mount-proc", "--kill-child", "--user", "--map-root-user"}),
        "the argv of nsys profile, nsys export and nsys --version, and of unshare, and the errors that quote "
        "those command lines: nsys's and unshare's own options"),
    "kvcache/writers/sgl_cubin_extract.py": (
        frozenset({"--no-deps", "--only-binary", "--python-version", "--platform"}),
        "the argv of pip download, which fetches the sgl-kernel wheel"),
    "api.py": (frozenset({"--port"}),
               "the argv of the child python -m kvprof dashboard that dashboard_server starts, as a shell would "
               "write it (test_the_flags_kvprof_passes_to_its_own_child_are_its_commands checks the option)"),
}


def _flag_strings(root: Path, others: dict[str, tuple[frozenset[str], str]]) -> list[str]:
    """Each `--flag` in a string of code under ``root`` (a literal, or an f-string's literal text
    taken whole) outside the command line, save another program's: ``others``' flags in their
    module, and the flags of a parser a module builds for itself (an ``ArgumentParser`` made
    there: its own ``python -m`` program or script), in that module or in a string that runs it
    (``-m`` and the module's name)."""
    trees = {f.relative_to(root).as_posix(): ast.parse(f.read_text()) for f in sorted(root.rglob("*.py"))}
    programs = {}
    for rel, tree in trees.items():
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        if any(_called(c) == "ArgumentParser" for c in calls):
            programs[_module(root / rel, root)] = {a.value for c in calls if _called(c) == "add_argument"
                                                   for a in c.args if isinstance(a, ast.Constant)}
    found = []
    for rel, tree in trees.items():
        if rel.startswith(COMMAND_LINE):
            continue
        own = programs.get(_module(root / rel, root), set()) | others.get(rel, (frozenset(), ""))[0]
        skip = _docstrings(tree) | {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                text = node.value
            else:
                continue
            run = set().union(*(flags for m, flags in programs.items() if f"-m {m}" in text))
            for flag in FLAG.findall(text):
                if flag not in own | run:
                    found.append((node.lineno, f"{root.name}/{rel}:{node.lineno}: {flag} in {text!r}"))
    return [line for _, line in sorted(found, key=lambda x: (x[1].split(":")[0], x[0]))]


def test_no_string_outside_the_command_line_spells_a_flag() -> None:
    """A setting a message names is a ``Setting`` part, spelled as a flag by kvprof.commands; what
    remains are other programs' flags where kvprof runs them."""
    assert _flag_strings(PKG, OTHER_PROGRAMS) == []


def test_each_other_programs_flag_is_spelled_where_it_is_listed() -> None:
    """No stale entry: OTHER_PROGRAMS allows exactly the flags its modules spell."""
    unlisted = _flag_strings(PKG, {})
    for rel, (flags, _) in OTHER_PROGRAMS.items():
        spelled = {line.split(": ", 1)[1].split(" in ", 1)[0] for line in unlisted if line.startswith(f"kvprof/{rel}:")}
        assert spelled == flags, rel


def test_the_flags_kvprof_passes_to_its_own_child_are_its_commands() -> None:
    """api.dashboard_server's ``--port`` is an option of ``kvprof dashboard``."""
    from kvprof.cli import build_parser
    from kvprof.commands import flag_names

    assert "--port" in flag_names(build_parser("dashboard")).values()


def test_the_flag_search_sees_what_the_command_line_would_spell(tmp_path: Path) -> None:
    pkg = tmp_path / "kvprof"
    (pkg / "commands").mkdir(parents=True)
    (pkg / "commands" / "run.py").write_text('HELP = "--warmup must be >= 0"\n')
    (pkg / "cli.py").write_text('p.add_argument("--version")\n')
    (pkg / "low.py").write_text(
        '"""Says --warmup in its docstring."""\n# and --warmup in a comment\n'
        'def f(n):\n    """--steps too."""\n    raise UsageError("--warmup must be >= 0")\n'
        'def g(n):\n    return f"raise --max-events {n:,} on a machine with more memory"\n')
    (pkg / "prog.py").write_text('import argparse\nap = argparse.ArgumentParser()\nap.add_argument("--out")\n'
                                 'if bad:\n    raise SystemExit("--out must be a folder")\n')
    (pkg / "hint.py").write_text('A = "run python -m kvprof.prog --out DIR"\nB = "run python -m kvprof.prog --in DIR"\n'
                                 'C = ["--out", "x"]\n')
    (pkg / "tool.py").write_text('ARGV = ["nsys", "--trace=cuda", "--layers"]\n')
    assert _flag_strings(pkg, {"tool.py": (frozenset({"--trace"}), "nsys")}) == [
        "kvprof/hint.py:2: --in in 'run python -m kvprof.prog --in DIR'",
        "kvprof/hint.py:3: --out in '--out'",
        "kvprof/low.py:5: --warmup in '--warmup must be >= 0'",
        "kvprof/low.py:7: --max-events in 'raise --max-events {} on a machine with more memory'",
        "kvprof/tool.py:1: --layers in '--layers'",
    ]
