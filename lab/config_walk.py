"""Follow one capture setting from ``kvprof.api.capture`` through the code, by reading it (AST).

What a maintainer does by hand to learn where, say, the decode batch sizes come from:
start at the facade's ``capture``, and follow the object that carries the capture's
settings (a ``CaptureConfig``, or the resolved plan the capture modules receive) into
every kvprof function it is handed to. Counted along the way:

* a **stop**: a place the walk has to look at for the field: a call that hands the carrier
  on (the callee is then walked too), a call of a carrier method that reads the field
  (directly or through other methods), or a read of the field itself (``config.field``);
* **files**: the files those stops are in (callers and callees);
* a **climb**: a stop where a lower module calls back up for a derived value: a carrier
  method or property that computes something (not a plain field), called from outside the
  carrier's own module and outside the one resolution function, or a call into a module
  already on the way down (a caller's module higher up the current call chain);
* **revisits**: the stops that land in the carrier's own module (the configuration read
  again for a derived value).

The carrier is recognised by its class name (``--carrier``, repeatable; a parameter
annotated with it, ``self.<attr>`` set from such a parameter, a name bound from a call whose
return annotation names it); the resolution function(s) by ``--resolver``. Calls are
resolved through each module's imports (function-level ones too), ``self``'s class and its
subclasses, and ``super()``. A static reading: a call through a value the AST cannot type
is not followed.

    python lab/config_walk.py                      # the working tree, field decode_sizes
    python lab/config_walk.py --rev a568244        # a commit (git archive into a temporary folder)
    python lab/config_walk.py --field layers -v    # every stop, one line each
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

START = "kvprof.api.capture"
CARRIERS = ("CaptureConfig", "CapturePlan")
# where the settings are resolved, before and after the plan: a derived value asked for here is
# the resolution itself, not a climb back up
RESOLVERS = ("kvprof.capture.runtime.prepare", "kvprof.capture.plan.resolve")


@dataclass
class Func:
    qual: str  # module.func or module.Class.meth
    module: str
    cls: str | None  # module.Class
    node: ast.FunctionDef | ast.AsyncFunctionDef
    file: str


@dataclass
class Cls:
    qual: str
    module: str
    node: ast.ClassDef
    bases: list[str] = field(default_factory=list)  # qualified where resolvable
    methods: dict[str, str] = field(default_factory=dict)  # name -> Func qual
    fields: set[str] = field(default_factory=set)  # annotated class attributes (dataclass fields)
    properties: set[str] = field(default_factory=set)


@dataclass
class Stop:
    kind: str  # pass | derive | read
    caller: str
    file: str
    line: int
    target: str
    target_file: str
    climb: bool = False


class Index:
    """Every module, function and class of kvprof under ``root``, with each module's imports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.funcs: dict[str, Func] = {}
        self.classes: dict[str, Cls] = {}
        self.imports: dict[str, dict[str, str]] = {}
        self.files: dict[str, str] = {}
        for path in sorted((root / "kvprof").rglob("*.py")):
            rel = path.relative_to(root)
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = ".".join(parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
            self.files[module] = str(rel)
            self.imports[module] = self._imports(tree, module, path.name == "__init__.py")
            self._defs(tree, module, str(rel))
        for c in self.classes.values():
            bases = [b.value if isinstance(b, ast.Subscript) else b for b in c.node.bases]  # Generic[T]
            c.bases = [self.resolve_name(c.module, ast.unparse(b)) or ast.unparse(b) for b in bases]

    @staticmethod
    def _imports(tree: ast.Module, module: str, package: bool) -> dict[str, str]:
        out: dict[str, str] = {}
        for node in ast.walk(tree):  # function-level imports count as the module's
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        out[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = module.split(".") if package else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                for a in node.names:
                    out[a.asname or a.name] = f"{base}.{a.name}"
        return out

    def _defs(self, tree: ast.Module, module: str, file: str) -> None:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{module}.{node.name}"
                self.funcs[q] = Func(q, module, None, node, file)
            elif isinstance(node, ast.ClassDef):
                cq = f"{module}.{node.name}"
                c = Cls(cq, module, node)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        q = f"{cq}.{item.name}"
                        self.funcs[q] = Func(q, module, cq, item, file)
                        c.methods[item.name] = q
                        if any(ast.unparse(d) in ("property", "functools.cached_property", "cached_property")
                               for d in item.decorator_list):
                            c.properties.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        c.fields.add(item.target.id)
                self.classes[cq] = c

    def resolve_name(self, module: str, dotted: str) -> str | None:
        """A dotted name as written in ``module`` -> a qualified kvprof name (function, class or module)."""
        head, _, rest = dotted.partition(".")
        local = f"{module}.{head}"
        if local in self.funcs or local in self.classes:
            base = local
        elif head in self.imports.get(module, {}):
            base = self.imports[module][head]
        else:
            return None
        q = f"{base}.{rest}" if rest else base
        return self._follow_reexport(q)

    def _follow_reexport(self, q: str, depth: int = 0) -> str:
        """``pkg.name`` where ``pkg/__init__.py`` imported ``name`` from elsewhere -> where it is defined."""
        if q in self.funcs or q in self.classes or depth > 5:
            return q
        mod, _, name = q.rpartition(".")
        target = self.imports.get(mod, {}).get(name)
        if target and target != q:
            return self._follow_reexport(target, depth + 1)
        # module.Class.meth written through a re-exported class
        mod2, _, meth = mod.rpartition(".")
        cls = self.imports.get(mod2, {}).get(mod.rpartition(".")[2])
        if cls:
            return self._follow_reexport(f"{cls}.{meth}" if False else f"{cls}.{name}", depth + 1) \
                if f"{cls}.{name}" in self.funcs else q
        return q

    def mro(self, cls: str) -> list[str]:
        out, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if c in out or c not in self.classes:
                continue
            out.append(c)
            todo.extend(self.classes[c].bases)
        return out

    def subclasses(self, cls: str) -> list[str]:
        return [c for c in self.classes if c != cls and cls in self.mro(c)]

    def method(self, cls: str, name: str) -> list[str]:
        """``name`` on an instance of ``cls``: the definition its MRO finds, and overrides below it."""
        found = []
        for c in self.mro(cls):
            q = self.classes[c].methods.get(name)
            if q:
                found.append(q)
                break
        for sub in self.subclasses(cls):
            q = self.classes[sub].methods.get(name)
            if q and q not in found:
                found.append(q)
        return found


class Walk:
    def __init__(self, index: Index, field_name: str, carriers: tuple[str, ...], resolvers: tuple[str, ...]) -> None:
        self.ix, self.field, self.resolvers = index, field_name, set(resolvers)
        self.carrier_classes = {q for q, c in index.classes.items() if c.node.name in carriers}
        self.stops: list[Stop] = []
        self.expanded: set[tuple[str, frozenset[str]]] = set()
        self._reads_field: dict[str, bool] = {}
        # attributes of a class (and its subclasses) that hold the carrier: self.config = config
        self.carrier_attrs: dict[str, set[str]] = {}

    # -- what a carrier method reads --------------------------------------------------------
    def reads_field(self, qual: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether carrier method ``qual`` reads the field, itself or through self's other methods."""
        if qual in self._reads_field:
            return self._reads_field[qual]
        f = self.ix.funcs.get(qual)
        if f is None or qual in seen:
            return False
        hit = False
        for node in ast.walk(f.node):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr == self.field:
                    hit = True
                elif f.cls and node.attr in self.ix.classes[f.cls].methods and node.attr != f.node.name:
                    hit = hit or self.reads_field(self.ix.classes[f.cls].methods[node.attr], seen | {qual})
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("asdict",):
                hit = True  # the whole object serialised: every field read
        self._reads_field[qual] = hit
        return hit

    def derived(self, cls: str, name: str) -> bool:
        """A carrier attribute that computes something (a method or property), not a plain field."""
        return any(name in self.ix.classes[c].methods for c in self.ix.mro(cls))

    # -- the walk ---------------------------------------------------------------------------
    def run(self, start: str) -> None:
        f = self.ix.funcs[start]
        params = self._carrier_params(f)
        self.visit(f, params, [f.module])
        # the child processes the walked modules start, which read the settings back: walked too
        spawned: set[str] = set()
        while True:
            walked = {self.ix.funcs[s.caller].module for s in self.stops} | {
                self.ix.funcs[s.target].module for s in self.stops if s.target in self.ix.funcs}
            found = False
            for g in list(self.ix.funcs.values()):
                if g.module not in walked:
                    continue
                for node in _in_order(g.node):
                    if isinstance(node, ast.List) and self._spawn(g, node, [g.module], spawned):
                        found = True
            if not found:
                break

    def _carrier_params(self, f: Func) -> set[str]:
        out = set()
        for a in [*f.node.args.posonlyargs, *f.node.args.args, *f.node.args.kwonlyargs]:
            if a.annotation is not None and self._names_carrier(f.module, a.annotation):
                out.add(a.arg)
        return out

    def _names_carrier(self, module: str, ann: ast.expr) -> bool:
        text = ast.unparse(ann)
        return any(self.ix.classes[c].node.name in text for c in self.carrier_classes)

    def _carrier_class(self) -> str | None:
        return next(iter(sorted(self.carrier_classes)), None)

    def visit(self, f: Func, carriers: set[str], stack: list[str]) -> None:
        attrs = set()
        if f.cls:
            for c in self.ix.mro(f.cls):
                attrs |= self.carrier_attrs.get(c, set())
        key = (f.qual, frozenset(carriers))
        if key in self.expanded:
            return
        self.expanded.add(key)
        names = set(carriers)
        for node in _in_order(f.node):
            if isinstance(node, ast.Assign) and f.cls and len(node.targets) == 1:
                t = node.targets[0]
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                        and self._is_carrier(node.value, names, attrs)):
                    self.carrier_attrs.setdefault(f.cls, set()).add(t.attr)
                    attrs.add(t.attr)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
                self._bind_results(f, node, names, attrs)
            if isinstance(node, ast.Call):
                self._call(f, node, names, attrs, stack)

            elif isinstance(node, ast.Attribute) and node.attr == self.field and self._is_carrier(
                    node.value, names, attrs):
                self._stop("read", f, node.lineno, f"{self._carrier_class()}.{self.field}", stack, derived=False)

    def _bind_results(self, f: Func, node: ast.Assign | ast.AnnAssign, names: set[str], attrs: set[str]) -> None:
        call = node.value
        assert isinstance(call, ast.Call)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        ret: ast.expr | None = None
        fn = call.func
        if isinstance(fn, ast.Attribute) and self._is_carrier(fn.value, names, attrs):
            for cls in self.carrier_classes:
                for q in self.ix.method(cls, fn.attr):
                    ret = self.ix.funcs[q].node.returns
        else:
            for q in self._callees(f, call, attrs, names):
                if q in self.ix.funcs:
                    ret = self.ix.funcs[q].node.returns
        if ret is None:
            return
        text = ast.unparse(ret)
        for t in targets:
            if isinstance(t, ast.Name) and self._names_carrier(f.module, ret):
                names.add(t.id)
            elif isinstance(t, ast.Tuple) and text.startswith("tuple["):
                parts = [p.strip() for p in text[6:-1].split(",")]
                for el, p in zip(t.elts, parts):
                    if isinstance(el, ast.Name) and any(self.ix.classes[c].node.name == p
                                                        for c in self.carrier_classes):
                        names.add(el.id)

    def _is_carrier(self, e: ast.expr, names: set[str], attrs: set[str]) -> bool:
        if isinstance(e, ast.Name):
            return e.id in names
        return (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self"
                and e.attr in attrs)

    def _callees(self, f: Func, call: ast.Call, attrs: set[str], names: set[str]) -> list[str]:
        fn = call.func
        out: list[str] = []
        if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "self" and f.cls:
            out = self.ix.method(f.cls, fn.attr)
        elif (isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Call)
              and isinstance(fn.value.func, ast.Name) and fn.value.func.id == "super" and f.cls):
            for base in self.ix.mro(f.cls)[1:]:
                q = self.ix.classes[base].methods.get(fn.attr)
                if q:
                    out = [q]
                    break
        else:
            try:
                dotted = ast.unparse(fn)
            except Exception:  # noqa: BLE001
                return []
            q = self.ix.resolve_name(f.module, dotted)
            if q in self.ix.classes:  # a constructor: its __init__ (its own or a base's)
                out = self.ix.method(q, "__init__")[:1]
                # a class whose __init__ is a base's still binds the carrier for its own methods
                self._pending_class = q
            elif q in self.ix.funcs:
                out = [q]
        return out

    def _call(self, f: Func, call: ast.Call, names: set[str], attrs: set[str], stack: list[str]) -> None:
        fn = call.func
        if isinstance(fn, ast.Attribute) and self._is_carrier(fn.value, names, attrs):
            for cls in sorted(self.carrier_classes):
                qs = self.ix.method(cls, fn.attr)
                if qs and self.reads_field(qs[0]):
                    self._stop("derive", f, call.lineno, qs[0], stack, derived=True)
                    g = self.ix.funcs[qs[0]]
                    self.visit(g, {"self"}, [*stack, g.module])
            return
        args = [(i, a) for i, a in enumerate(call.args)] + [(k.arg, k.value) for k in call.keywords]
        passed = [(pos, a) for pos, a in args if self._is_carrier(a, names, attrs)]
        if not passed:
            if attrs and isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "self":
                for q in self._callees(f, call, attrs, names):  # the method reads self's carrier itself
                    g = self.ix.funcs[q]
                    self.visit(g, set(), [*stack, g.module])
            return
        self._pending_class = None
        for q in self._callees(f, call, attrs, names):
            g = self.ix.funcs[q]
            self._stop("pass", f, call.lineno, q, stack, derived=False)
            params = [a.arg for a in [*g.node.args.posonlyargs, *g.node.args.args]]
            if g.cls and params and params[0] in ("self", "cls"):
                params = params[1:]
            bound = set()
            for pos, _ in passed:
                if isinstance(pos, int) and pos < len(params):
                    bound.add(params[pos])
                elif isinstance(pos, str):
                    bound.add(pos)
            self.visit(g, bound, [*stack, g.module])
            owner = self._pending_class
            if owner and owner != g.cls:  # e.g. MHASession() running VariantSession.__init__
                for sub_q in self.ix.classes[owner].methods.values():
                    h = self.ix.funcs[sub_q]
                    self.visit(h, set(), [*stack, h.module])

    _pending_class: str | None = None

    def _spawn(self, f: Func, node: ast.List, stack: list[str], spawned: set[str]) -> bool:
        """``[sys.executable, "-m", "kvprof.x", ...]`` built where the carrier is at hand: a child
        process that reads the settings back (the nsys child, each rank). Its module is walked
        whole: it binds its own carrier from what it reads (``from_dict``, ``resolve_settings``)."""
        consts = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
        for i, c in enumerate(consts[:-1]):
            target = consts[i + 1]
            if c == "-m" and isinstance(target, str) and target in self.ix.files and target not in spawned:
                spawned.add(target)
                stop = Stop("spawn", f.qual, f.file, node.lineno, target, self.ix.files[target])
                self.stops.append(stop)
                before = len(self.stops)
                for g in list(self.ix.funcs.values()):
                    if g.module == target:
                        self.visit(g, set(), [*stack, target])
                if len(self.stops) == before:  # a process that never reads the settings: not on the walk
                    self.stops.remove(stop)
                return True
        return False

    def _stop(self, kind: str, f: Func, line: int, target: str, stack: list[str], derived: bool) -> None:
        tf = self.ix.funcs[target].file if target in self.ix.funcs else self.ix.files.get(
            target.rsplit(".", 2)[0], f.file)
        target_module = self.ix.funcs[target].module if target in self.ix.funcs else target.rsplit(".", 2)[0]
        climb = False
        if derived and f.module != target_module and f.qual not in self.resolvers:
            climb = True
        elif kind == "pass" and target_module != f.module and target_module in stack[:-1]:
            climb = True  # back into a module already passed on the way down
        self.stops.append(Stop(kind, f.qual, f.file, line, target, tf, climb))


def _in_order(node: ast.AST) -> Iterator[ast.AST]:
    """Every node of a function body in source order, nested functions included."""
    for child in ast.iter_child_nodes(node):
        yield child
        yield from _in_order(child)


def tree_of(rev: str | None, tmp: Path) -> Path:
    if rev is None:
        return Path(__file__).resolve().parents[1]
    repo = Path(__file__).resolve().parents[1]
    data = subprocess.run(["git", "-C", str(repo), "archive", rev, "kvprof"], check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(tmp, filter="data")
    return tmp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="a git revision to read instead of the working tree")
    ap.add_argument("--field", default="decode_sizes",
                    help="the setting(s) to follow, comma-separated, one row each (default: decode_sizes)")
    ap.add_argument("--carrier", action="append", help=f"carrier class name (default: {', '.join(CARRIERS)})")
    ap.add_argument("--resolver", action="append", help=f"resolution function (default: {', '.join(RESOLVERS)})")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every stop")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = tree_of(args.rev, Path(tmp))
        index = Index(root)
        for name in args.field.split(","):
            walk = Walk(index, name, tuple(args.carrier or CARRIERS), tuple(args.resolver or RESOLVERS))
            walk.run(START)
            stops = walk.stops
            files = {s.file for s in stops} | {s.target_file for s in stops}
            carrier_files = {walk.ix.classes[c].module for c in walk.carrier_classes}
            revisits = [s for s in stops if s.kind == "derive" and walk.ix.funcs[s.target].module in carrier_files
                        and walk.ix.funcs[s.caller].module not in carrier_files]
            if args.verbose:
                print(f"-- {name}")
                for s in stops:
                    mark = " CLIMB" if s.climb else ""
                    print(f"{s.kind:6} {s.file}:{s.line} {s.caller.removeprefix('kvprof.')} -> "
                          f"{s.target.removeprefix('kvprof.')}{mark}")
            rows.append((name, len(stops), len(files), sum(s.climb for s in stops), len(revisits)))
    print(f"tree: {args.rev or 'working tree'}; from {START}; carriers: {', '.join(args.carrier or CARRIERS)}")
    print(f"{'field':<16} {'stops':>6} {'files':>6} {'climbs':>7} {'revisits':>9}")
    for name, n, f, c, r in rows:
        print(f"{name:<16} {n:>6} {f:>6} {c:>7} {r:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
