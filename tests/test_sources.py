"""The timing sources (kvprof.core.sources) are named, ordered and labelled in one module.

The analysis, the reports and the dashboard derive their orders and labels from it; a
module that spells the list again (a tuple of source names, a label as a literal) drifts
from the others when a source is added or renamed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kvprof.core import sources
from kvprof.core.sources import KINETO, NSYS, REFERENCE, SOURCES, TRUST_ORDER, source_names

PKG = Path(__file__).resolve().parent.parent / "kvprof"
NAMES = set(source_names(SOURCES))
# the labels in words (a short label, "ref" or "torch", is also an everyday word: the maps above find it)
LABELS = {getattr(s, f) for s in SOURCES for f in ("tool", "label", "pass_words", "prose")} - NAMES


def _spelled_again(root: Path) -> list[str]:
    """Each literal outside core/sources.py that lists two or more source names, or is a source's label."""
    found = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if rel.endswith("core/sources.py"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                listed = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]
                if len(listed) >= 2:
                    found.append(f"{rel}:{node.lineno} lists {listed}")
            elif isinstance(node, ast.Dict):
                keyed = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in NAMES]
                if len(keyed) >= 2:
                    found.append(f"{rel}:{node.lineno} maps {keyed}")
            elif isinstance(node, ast.Constant) and node.value in LABELS:
                found.append(f"{rel}:{node.lineno} spells {node.value!r}")
    return found


def test_no_module_but_core_sources_lists_or_labels_the_timing_sources() -> None:
    assert _spelled_again(PKG) == []


def test_the_scan_finds_a_list_a_map_and_a_label(tmp_path: Path) -> None:
    """The scan above is not vacuous: the three ways the sources were spelled before are found."""
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "gate.py").write_text('FALLBACK_ORDER = ("reference", "nsys", "kineto")\n')
    (tmp_path / "verdict.py").write_text('SHORT = {"reference": "ref", "kineto": "torch"}\nX = "Nsight Systems"\n')
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "sources.py").write_text('SOURCES = ("reference", "kineto", "nsys")\n')
    found = _spelled_again(tmp_path)
    assert [f.split(" ", 1)[0] for f in found] == ["analysis/gate.py:1", "verdict.py:1", "verdict.py:2"], found


def test_the_orders_every_view_uses() -> None:
    """Headline figures: the reference, then nsys before torch.profiler (it perturbs graph replays
    less); passes and the event table in capture order; every source has each label."""
    assert source_names(TRUST_ORDER) == ("reference", "nsys", "kineto")
    assert source_names(sources.PROFILED) == ("kineto", "nsys")
    assert source_names(SOURCES) == ("reference", "kineto", "nsys")
    assert sources.BY_NAME == {"reference": REFERENCE, "kineto": KINETO, "nsys": NSYS}
    assert all(s.short and s.tool and s.label and s.pass_words and s.prose for s in SOURCES)


def test_the_views_read_their_words_from_core() -> None:
    """A label changed in core reaches the analysis note, the verdict column, the console and the
    trust order of the gate and the dashboard (derived, not copied)."""
    from kvprof.analysis import gate, reference
    from kvprof.core import schema, timings
    from kvprof.report import console, verdict

    assert reference.SOURCE_LABELS == {s.name: s.label for s in SOURCES}
    assert verdict.SHORT_SOURCE == {s.name: s.short for s in SOURCES}
    assert verdict.SOURCE_WORDS == {s.name: s.tool for s in SOURCES}
    assert console.SOURCE_NAMES == {s.name: s.prose for s in SOURCES}
    assert timings.SOURCE_NAMES == {s.name: s.pass_words for s in SOURCES}
    assert timings.PASSES == source_names(SOURCES)
    assert schema.SOURCES == source_names(sources.PROFILED)
    assert gate.FALLBACK_ORDER == source_names(TRUST_ORDER)
    assert reference.trusted_sources(["kineto", "reference", "nsys"], None) == ["reference", "nsys", "kineto"]
