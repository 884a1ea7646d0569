"""kvprof's trace readers register themselves into core's registry from above.

kvprof.core.readers holds the Protocol and the registry and names no module above core, not
even as a string to import: kvprof.trace.readers adds the built-ins when kvprof.trace is
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


def _module_strings(root: Path, pkg: str) -> list[str]:
    """String constants in ``root``'s modules that name a kvprof module outside ``pkg``
    ("kvprof.trace.readers:KINETO", "kvprof.trace.readers")."""
    found = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                target = node.value.partition(":")[0]
                if not target.startswith("kvprof.") or target.startswith(pkg) or " " in target:
                    continue
                rel = Path(*target.split("."))
                if (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file():
                    found.append(f"{f.relative_to(root).as_posix()}:{node.lineno} names {node.value}")
    return found


def test_core_names_no_module_above_it_to_import() -> None:
    assert _module_strings(CORE, "kvprof.core") == []


def test_the_scan_finds_a_reader_named_by_string(tmp_path: Path) -> None:
    (tmp_path / "readers.py").write_text(
        'TARGET = "kvprof.trace.readers:NSYS_SQLITE"\nSCHEMA = "kvprof.step_timings/1"\n')
    assert _module_strings(tmp_path, "kvprof.core") == ["readers.py:1 names kvprof.trace.readers:NSYS_SQLITE"]


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
