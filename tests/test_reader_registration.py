"""kvprof's trace readers register themselves into core's registry from above.

kvprof.core.readers holds the Protocol and the registry and imports no module above core, not
even by a string at run time: kvprof.trace.readers adds the built-ins when kvprof.trace is
imported, and the entry points reach them through kvprof.api.trace_readers(). Asking the
registry before that is an error, never an empty answer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "kvprof" / "core"


def _fresh(code: str) -> str:
    """``code`` run in a new interpreter (nothing of kvprof imported yet); its stdout."""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return out


def _string_imports(root: Path) -> list[str]:
    """Each call in ``root``'s modules that imports a module named by a string at run time
    (``importlib.import_module(...)``, ``__import__(...)``): a dependency no import statement shows."""
    found = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in ("import_module", "__import__"):
                    found.append(f"{f.relative_to(root).as_posix()}:{node.lineno} calls {name}")
    return found


def test_core_imports_nothing_by_string() -> None:
    """core loads no module by name at run time (it named trace's readers so before): whatever
    it needs from above is registered into it. Data that names a module for a layer above to
    import (core/variants.py's writer factories) is not an import of core's."""
    assert _string_imports(CORE) == []


def test_the_scan_finds_a_reader_imported_by_string(tmp_path: Path) -> None:
    (tmp_path / "readers.py").write_text(
        'import importlib\nTARGET = "kvprof.trace.readers:NSYS_SQLITE"\n'
        'def read(t):\n    module, _, attr = t.partition(":")\n'
        '    return getattr(importlib.import_module(module), attr)\n'
        'def old(t):\n    return __import__(t)\n')
    assert sorted(_string_imports(tmp_path)) == ["readers.py:5 calls import_module", "readers.py:7 calls __import__"]


def test_importing_trace_registers_the_builtins_in_order_and_nothing_heavy() -> None:
    out = _fresh(
        "import sys\n"
        "import kvprof.core.readers as r\n"
        "try:\n"
        "    r.REGISTRY.readers()\n"
        "    print('answered')\n"
        "except RuntimeError as exc:\n"
        "    print('refused:', exc)\n"
        "print('trace imported:', any(m.startswith('kvprof.trace') for m in sys.modules))\n"
        "import kvprof.trace\n"
        "print('readers:', ' '.join(x.name for x in r.REGISTRY.readers()))\n"
        "print('heavy:', [m for m in ('pandas', 'numpy', 'kvprof.trace.kineto') if m in sys.modules])\n")
    lines = out.splitlines()
    assert lines[0].startswith("refused: no built-in trace reader is registered: import kvprof.trace"), out
    assert lines[1:] == ["trace imported: False", "readers: nsys_sqlite kineto nsys_rep", "heavy: []"], out


def test_a_plugin_registered_first_is_still_tried_after_the_builtins() -> None:
    out = _fresh(
        "from pathlib import Path\n"
        "import kvprof.core.readers as r\n"
        "class Any:\n"
        "    name, suffixes = 'any', ('.json',)\n"
        "    def sniff(self, head, path): return True\n"
        "    def read(self, path, max_events, export_dir=None): raise r.NotThisFormat('no')\n"
        "r.register(Any())\n"
        "from kvprof import api\n"
        "reg = api.trace_readers()\n"
        "print(' '.join(x.name for x in reg.readers()))\n"
        "print(reg.for_head(b'{\"traceEvents\": []}', Path('t.json')).name)\n"
        "print(reg.for_head(b'PK', Path('t.zip')).name)\n")
    assert out.splitlines() == ["nsys_sqlite kineto nsys_rep any", "kineto", "any"], out


def test_a_builtin_is_registered_once_even_when_its_module_is_reloaded() -> None:
    out = _fresh(
        "import importlib\n"
        "import kvprof.trace.readers as tr\n"
        "importlib.reload(tr)\n"
        "from kvprof.core.readers import REGISTRY\n"
        "print(' '.join(x.name for x in REGISTRY.readers()))\n")
    assert out.strip() == "nsys_sqlite kineto nsys_rep"
