"""The regression gate's renderers: a console table of judged rows and a JUnit XML report.

JUnit: one <testsuite name="kvprof.gate">, one <testcase> per judged (variant, phase,
size) named ``variant phase size`` with classname ``kvprof.gate.<source>``; a regressed
row carries a <failure> whose message gives both costs, the slowdown and the spread.
Rows that could not be judged are <testcase>s with <skipped>.
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

from rich.table import Table

from kvprof.analysis.gate import GateResult, GateRow
from kvprof.core.text import markup, printable


def _us(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1000:.3f}"


def row_text(r: GateRow, threshold_pct: float) -> str:
    spread = (f"spread {_us(r.spread_ns)} µs (IQR {_us(r.base_iqr_ns)} + {_us(r.new_iqr_ns)})" if r.spread_known
              else "spread unknown (fewer than 4 steps): judged on the threshold alone")
    return (f"{printable(r.variant)} {printable(r.phase)} {r.size} ({printable(r.source)}): "
            f"{_us(r.base_ns)} -> {_us(r.new_ns)} µs per write, "
            f"{r.slower_pct:+.1f} % (threshold {threshold_pct:g} %), {spread}")


def gate_table(rows: list[GateRow], threshold_pct: float, title: str = "gate") -> Table:
    t = Table(title=f"{title}: slower than BASE by more than {threshold_pct:g} % and by more than the spread "
                    "(both runs' step IQR per write)", title_justify="left")
    for col in ("variant", "phase", "size", "source", "BASE µs", "NEW µs", "slower %", "spread µs", "verdict"):
        t.add_column(col, justify="left" if col in ("variant", "phase", "source", "verdict") else "right",
                     no_wrap=True)
    for r in rows:
        t.add_row(markup(r.variant), markup(r.phase), markup(r.size), markup(r.source), _us(r.base_ns), _us(r.new_ns),
                  f"{r.slower_pct:+.1f}",
                  _us(r.spread_ns) if r.spread_known else "n/a (<4 steps)",
                  "[red]regressed[/red]" if r.regressed else "ok")
    return t


def junit_xml(gate: GateResult, base: str, new: str) -> str:
    """The JUnit XML document (a string with its declaration); control characters, which XML
    1.0 cannot hold, are written as their escapes."""
    suite = ET.Element("testsuite", name="kvprof.gate", tests=str(len(gate.rows) + len(gate.unjudged)),
                       failures=str(len(gate.regressed)), skipped=str(len(gate.unjudged)), errors="0")
    props = ET.SubElement(suite, "properties")
    for k, v in (("base", base), ("new", new), ("threshold_pct", f"{gate.threshold_pct:g}")):
        ET.SubElement(props, "property", name=k, value=printable(v))
    for r in gate.rows:
        case = ET.SubElement(suite, "testcase", classname=printable(f"kvprof.gate.{r.source}"),
                             name=printable(f"{r.variant} {r.phase} {r.size}"))
        if r.regressed:
            ET.SubElement(case, "failure", message=row_text(r, gate.threshold_pct), type="regression")
        else:
            ET.SubElement(case, "system-out").text = row_text(r, gate.threshold_pct)
    for why in gate.unjudged:
        case = ET.SubElement(suite, "testcase", classname="kvprof.gate", name=printable(why.split(":")[0]))
        ET.SubElement(case, "skipped", message=printable(why))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


__all__ = ["gate_table", "junit_xml", "row_text"]
