"""The regression gate's renderers: one line per judged row (a CI log is read as it is, never
folded into a narrow table) and a JUnit XML report.

JUnit: one <testsuite name="kvprof.gate">, one <testcase> per judged (variant, phase,
size) named ``variant phase size`` with classname ``kvprof.gate.<source>``; a regressed
row carries a <failure> whose message gives both costs, the slowdown and the noise, a row
too noisy to judge a <skipped> whose message starts "inconclusive". Rows that could not be
judged, and rows left out (Triton's interpreter), are <testcase>s with <skipped>; runs that
cannot be compared are one <testcase name="comparable"> with an <error> per reason.
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

from kvprof.analysis.gate import GateResult, GateRow
from kvprof.core.text import printable


def _us(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1000:.3f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}"


def _level(r: GateRow) -> str:
    return "" if r.confidence is None else f"{r.confidence * 100:.4g} % "


def noise_text(r: GateRow) -> str:
    """The noise the row was held against, in words."""
    if r.noise == "control":
        drift = r.drift_pct or 0.0
        return (f"over torch's control {_pct(r.judged_pct)} %, {_level(r)}interval {_pct(r.low_pct)} .. "
                f"{_pct(r.high_pct)} %; the machine ran the control {abs(drift):.1f} % "
                f"{'slower' if drift >= 0 else 'faster'} in NEW")
    if r.noise == "control check":
        drift = r.drift_pct or 0.0
        return (f"torch's index_put over numpy's {_pct(r.judged_pct)} %, {_level(r)}interval {_pct(r.low_pct)} .. "
                f"{_pct(r.high_pct)} %; the machine ran numpy's {abs(drift):.1f} % "
                f"{'slower' if drift >= 0 else 'faster'} in NEW")
    if r.noise == "bootstrap":
        text = (f"{_level(r)}interval {_pct(r.low_pct)} .. {_pct(r.high_pct)} % (bootstrap of the reference pass's "
                "per-step samples)")
        if r.confirmed_in:
            text += f"; {r.confirmed_in} pass: low end {_pct(r.confirm_low_pct)} %"
        return text
    return f"spread {_us(r.spread_ns)} µs (step IQR {_us(r.base_iqr_ns)} + {_us(r.new_iqr_ns)} per write)"


def row_text(r: GateRow, threshold_pct: float) -> str:
    noisy = ""
    if r.status == "inconclusive" and r.noise_pct is not None:
        noisy = f"; noise +-{r.noise_pct:.1f} % exceeds the threshold"
        if r.steps_needed is not None:
            noisy += f" (about {r.steps_needed} reference steps in both runs would settle it; {r.steps} were timed)"
        elif r.level_pct is not None and r.confidence is not None:
            noisy += (f" (the level noise, +-{r.level_pct:.1f} % a series, which more steps do not average out, "
                      "is as wide by itself)")
    return (f"{printable(r.variant)} {printable(r.phase)} {r.size} ({printable(r.source)}): "
            f"{_us(r.base_ns)} -> {_us(r.new_ns)} µs per write, "
            f"{r.slower_pct:+.1f} % (threshold {threshold_pct:g} %); {noise_text(r)}{noisy}")


def junit_xml(gate: GateResult, base: str, new: str) -> str:
    """The JUnit XML document (a string with its declaration); control characters, which XML
    1.0 cannot hold, are written as their escapes."""
    skipped = len(gate.unjudged) + len(gate.left_out) + len(gate.inconclusive)
    errors = 1 if gate.not_comparable else 0
    suite = ET.Element("testsuite", name="kvprof.gate", tests=str(len(gate.rows) + skipped + errors),
                       failures=str(len(gate.regressed)), skipped=str(skipped), errors=str(errors))
    props = ET.SubElement(suite, "properties")
    for k, v in (("base", base), ("new", new), ("threshold_pct", f"{gate.threshold_pct:g}"),
                 ("verdict", gate.verdict)):
        ET.SubElement(props, "property", name=k, value=printable(v))
    if gate.not_comparable:
        case = ET.SubElement(suite, "testcase", classname="kvprof.gate", name="comparable")
        for why in gate.not_comparable:
            ET.SubElement(case, "error", message=printable(why), type="not comparable")
    for r in gate.rows:
        case = ET.SubElement(suite, "testcase", classname=printable(f"kvprof.gate.{r.source}"),
                             name=printable(f"{r.variant} {r.phase} {r.size}"))
        if r.regressed:
            ET.SubElement(case, "failure", message=row_text(r, gate.threshold_pct), type="regression")
        elif r.status == "inconclusive":
            ET.SubElement(case, "skipped", message="inconclusive: " + row_text(r, gate.threshold_pct))
        else:
            ET.SubElement(case, "system-out").text = row_text(r, gate.threshold_pct)
    for why in [*gate.unjudged, *gate.left_out]:
        case = ET.SubElement(suite, "testcase", classname="kvprof.gate", name=printable(why.split(":")[0]))
        ET.SubElement(case, "skipped", message=printable(why))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


__all__ = ["junit_xml", "noise_text", "row_text"]
