"""Every output form of a command's result, by name: ``render(name, result, out)``.

A renderer is a small class with ``render(result, out)``, registered under a name (what
``--format`` or an option calls the form) and the result type it renders: "table" of an
analysis and "table" of a comparison are two renderers behind one call, and a command says
which form it wants instead of choosing code by if/elif. Options a form needs
(the run names in a JUnit report) go to the renderer's constructor, as in pyinstrument.

The tables and documents are built where they were (kvprof.report.console, .files, .gate,
.write_kernels); the HTML report's renderer is kvprof.dashboard.html_report's, registered
when that module is imported (the dashboard sits above this layer).

The registry is also where the commands' ``--format`` choices come from (``formats``), read
while the parser is built: so this module imports no result type whose module brings pandas.
Those are named by ``module:qualname`` (ANALYSIS, GATE_RESULT), which matches the type itself
when a result is rendered.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kvprof.core.errors import Setting, UsageError, Words
from kvprof.core.text import markup, printable

if TYPE_CHECKING:  # rich is imported when a table is printed, not for a json or csv document
    from rich.console import Console

    # pandas: imported when a result is built, not while a parser reads the forms (``ANALYSIS``)
    from kvprof.analysis.gate import GateResult
    from kvprof.analysis.summary import Analysis

# Result types named as ``module:qualname``, whose modules are too heavy to import for their name.
ANALYSIS = "kvprof.analysis.summary:Analysis"
GATE_RESULT = "kvprof.analysis.gate:GateResult"


@dataclass(frozen=True)
class Output:
    """Where a renderer writes. ``console``: tables and lines for people (stdout with the table
    form, stderr when stdout holds a document; kvprof.report.terminal.table_console). A
    document form (json, csv) writes stdout itself; a file form (junit, html) writes ``path``.
    ``names``: how a line spells a setting it names (``kvprof.core.errors.Setting``): by its
    field, or as the command line passes, by its flag."""

    console: Console | None = None
    path: Path | None = None
    names: Callable[[str], str] = str

    def need_console(self) -> Console:
        if self.console is None:
            raise ValueError("this renderer prints tables: give Output a console")
        return self.console

    def need_path(self) -> Path:
        if self.path is None:
            raise ValueError("this renderer writes a file: give Output a path")
        return self.path


class Renderer(Protocol):
    """One output form of one result type (``register`` names both). A form that writes a file
    (junit, html) says so with a class attribute ``writes_file = True``: it is an option of its
    own, not a ``--format`` choice."""

    def render(self, result: Any, out: Output) -> None: ...


# (result type's key, form) -> renderer, in registration order
_REGISTRY: dict[tuple[str, str], type[Renderer]] = {}

RendererT = TypeVar("RendererT", bound=Renderer)
ResultType = type | str  # a result type, or its "module:qualname"


def result_key(result_type: ResultType) -> str:
    """``module:qualname`` of a result type (a name given as one is kept)."""
    return result_type if isinstance(result_type, str) else f"{result_type.__module__}:{result_type.__qualname__}"


def _keys(result_type: ResultType) -> list[str]:
    """The type's key, then its bases' (a subclass finds its bases' forms)."""
    return [result_type] if isinstance(result_type, str) else [result_key(t) for t in result_type.__mro__]


def _type_name(result_type: ResultType) -> str:
    return result_key(result_type).rpartition(":")[2]


def register(name: str, result_type: ResultType) -> Callable[[type[RendererT]], type[RendererT]]:
    """Class decorator: the class renders ``result_type`` (and its subclasses) as ``name``
    (table, json, csv, junit, html); one renderer per pair."""
    key = result_key(result_type)

    def add(cls: type[RendererT]) -> type[RendererT]:
        known = _REGISTRY.get((key, name))
        # the same class again is a module imported anew (a reload), not a second renderer
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"a {name!r} renderer for {_type_name(result_type)} is already registered")
        _REGISTRY[(key, name)] = cls
        return cls

    return add


def names(result_type: ResultType) -> list[str]:
    """The forms ``result_type`` can be rendered in (its own and its bases'), sorted."""
    keys = _keys(result_type)
    return sorted({name for (k, name) in _REGISTRY if k in keys})


def formats(*result_types: ResultType) -> tuple[str, ...]:
    """The ``--format`` choices of a command whose result is any of ``result_types``: the forms
    each can print (not those that write a file), in the order they were registered, the
    type's own before its bases'."""
    found: list[list[str]] = []
    for result_type in result_types:
        forms: list[str] = []
        for key in _keys(result_type):
            forms += [name for (k, name), cls in _REGISTRY.items()
                      if k == key and name not in forms and not getattr(cls, "writes_file", False)]
        found.append(forms)
    return tuple(f for f in found[0] if all(f in other for other in found[1:])) if found else ()


def get_renderer(name: str, result_type: type, **options: Any) -> Renderer:
    """The renderer of ``result_type`` (or its nearest base) called ``name``, built with ``options``."""
    for key in _keys(result_type):
        cls = _REGISTRY.get((key, name))
        if cls is not None:
            return cls(**options)
    known = ", ".join(names(result_type)) or "none"
    raise UsageError(f"no {name!r} output for {_type_name(result_type)} (one of: {known})")


def render(name: str, result: Any, out: Output, **options: Any) -> None:
    """``result`` in the form ``name``, into ``out``."""
    get_renderer(name, type(result), **options).render(result, out)


# --- results the commands render that have no type of their own -------------------------------------

@dataclass(frozen=True)
class ComparisonDoc:
    """compare's result: compare.json's document, JSON-safe (what --format json prints)."""

    doc: dict[str, Any]


@dataclass(frozen=True)
class VariantComparisonDoc(ComparisonDoc):
    """``compare RUN``: each variant against the baseline (kvprof.analysis.compare.compare_groups)."""


@dataclass(frozen=True)
class RunComparisonDoc(ComparisonDoc):
    """``compare RUN RUN2``: each variant before -> after (kvprof.analysis.runs.RunComparison's
    document; the gate's verdict under ``gate`` when one was asked for)."""


# --- analyze -----------------------------------------------------------------------------------------

@register("table", ANALYSIS)
class AnalysisTable:
    """The console view: one table per source, verdicts, comparison, warnings, write kernels by name."""

    def render(self, result: Analysis, out: Output) -> None:
        from kvprof.report.console import render as render_summary
        from kvprof.report.write_kernels import render_write_kernels

        con = out.need_console()
        render_summary(result.summary, con)
        render_write_kernels(result.summary.write_kernels, con, out.names)


@register("json", ANALYSIS)
class AnalysisJson:
    """summary.json's document on stdout."""

    def render(self, result: Analysis, out: Output) -> None:
        from kvprof.report.terminal import print_json

        print_json(result.summary.to_json())


@register("csv", ANALYSIS)
class AnalysisCsv:
    """summary.csv's table on stdout."""

    def render(self, result: Analysis, out: Output) -> None:
        from kvprof.report.files import frame_csv, groups_csv
        from kvprof.report.terminal import print_text

        print_text(frame_csv(groups_csv(result.groups, result.summary)))


# --- compare -----------------------------------------------------------------------------------------

@register("json", ComparisonDoc)
class ComparisonJson:
    """compare.json's document on stdout."""

    def render(self, result: ComparisonDoc, out: Output) -> None:
        from kvprof.report.terminal import print_json

        print_json(result.doc)


@register("csv", ComparisonDoc)
class ComparisonCsv:
    """The comparison's rows as CSV on stdout."""

    def render(self, result: ComparisonDoc, out: Output) -> None:
        from kvprof.report.terminal import csv_text, print_text

        print_text(csv_text(result.doc["rows"]))


@register("table", VariantComparisonDoc)
class VariantComparisonTable:
    """The comparison table, the headline against the benchmark, the warnings."""

    def render(self, result: VariantComparisonDoc, out: Output) -> None:
        from kvprof.report.console import comparison_table

        con, doc = out.need_console(), result.doc
        if doc["rows"]:
            con.print(comparison_table(doc))
        h, b = doc.get("headline"), doc["benchmark"]
        if h:
            con.print(f"captured {markup(h['variant'])} ({markup(h['source'])}, decode bs={markup(h['size'])}): "
                      "saving "
                      f"{h['saving_per_step_ms']:.3f} ms per step -> ITL {b['itl_before_ms']:.2f} -> "
                      f"{h['predicted_itl_ms']:.2f} ms; measured {b['itl_before_ms']:.2f} -> "
                      f"{b['itl_after_ms']:.2f} ms")
        for w in doc["warnings"]:
            con.print(f"[yellow]warning:[/yellow] {markup(w)}", soft_wrap=True)


@register("table", RunComparisonDoc)
class RunComparisonTable:
    """Run vs run: both runs with their capture times, why they may not compare, the table, the
    variants with no row."""

    def render(self, result: RunComparisonDoc, out: Output) -> None:
        from kvprof.report.console import run_comparison_table

        con, doc = out.need_console(), result.doc
        for line in _runs_lines(doc["runs"]):
            con.print(line, soft_wrap=True, markup=False, highlight=False)
        for why in doc.get("not_comparable") or []:
            con.print(f"[yellow]warning:[/yellow] not comparable: {markup(why)}", soft_wrap=True)
        if doc["rows"]:
            con.print(run_comparison_table(doc))
        for why in doc["empty"]:
            con.print(f"[yellow]no row:[/yellow] {markup(why)}", soft_wrap=True)


def _runs_lines(runs: dict[str, Any]) -> list[str]:
    """before -> after with both capture times; a note when the order given is not the order captured."""
    b, a = runs["before"], runs["after"]
    lines = [f"before: {printable(b['input'])} ({b['captured']}) -> after: {printable(a['input'])} ({a['captured']})"]
    if b["captured_at"] and a["captured_at"] and b["captured_at"] > a["captured_at"]:
        lines.append(f"note: the before run ({printable(b['input'])}) was captured after the after run "
                     f"({printable(a['input'])}); the order given is kept")
    return lines


# --- the regression gate -----------------------------------------------------------------------------

@register("table", GATE_RESULT)
class GateTable:
    """Why the runs cannot be compared, the regressed rows, the rows too noisy to judge and the
    rows over the threshold that stay inside the noise (one line each: a CI log is read as it
    is), the verdict, the rows that could not be judged or were left out. ``exit_code``: the
    command's exit code for a gate that judged nothing, ``inconclusive_exit_code`` for one too
    noisy to judge, each named in the verdict."""

    def __init__(self, exit_code: int | None = None, inconclusive_exit_code: int | None = None) -> None:
        self.exit_code, self.inconclusive_exit_code = exit_code, inconclusive_exit_code

    def render(self, result: GateResult, out: Output) -> None:
        from kvprof.report.gate import row_text

        con, gate = out.need_console(), result
        for why in gate.not_comparable:
            con.print(f"[red]not comparable:[/red] {markup(why)}", soft_wrap=True)
        for line in gate.notes:
            con.print(f"[yellow]note:[/yellow] {markup(line)}", soft_wrap=True)
        for r in gate.regressed:
            con.print(f"[red]regressed:[/red] {markup(row_text(r, gate.threshold_pct))}", soft_wrap=True,
                      highlight=False)
        for r in gate.inconclusive:
            con.print(f"[yellow]too noisy to judge:[/yellow] {markup(row_text(r, gate.threshold_pct))}",
                      soft_wrap=True, highlight=False)
        for r in gate.rows:  # the table's raw ratio alone would read as a regression: say why it is not one
            if r.status == "passed" and r.slower_pct > gate.threshold_pct:
                con.print(f"not a regression: {markup(row_text(r, gate.threshold_pct))}", soft_wrap=True,
                          highlight=False)
        rule = f"slower than BASE by more than {gate.threshold_pct:g} % beyond the noise"
        exit_text = "" if self.exit_code is None else f"; exit {self.exit_code}"
        verdict = gate.verdict
        if not gate.comparable:
            line = (f"gate: not judged, the runs cannot be compared ({len(gate.not_comparable)} reason(s) "
                    f"above){exit_text}")
        elif verdict == "not judged":
            line = f"gate: not judged, no row could be judged (see below){exit_text}"
        elif verdict == "regressed":
            line = f"gate: {len(gate.regressed)} of {len(gate.rows)} rows {rule}"
        elif verdict == "inconclusive":
            code = "" if self.inconclusive_exit_code is None else f"; exit {self.inconclusive_exit_code}"
            line = (f"gate: inconclusive, too noisy to judge: none of {len(gate.rows)} rows {rule}, but the "
                    f"interval of {len(gate.inconclusive)} reaches both sides of {gate.threshold_pct:g} % "
                    f"({_settle(gate, out.names)}){code}")
        else:
            line = f"gate: passed, none of {len(gate.rows)} rows {rule}"
        con.print(line, soft_wrap=True)
        for why in gate.unjudged:
            con.print(f"[yellow]not judged:[/yellow] {markup(why)}", soft_wrap=True)
        for why in _grouped(gate.left_out):
            con.print(f"[yellow]left out:[/yellow] {markup(why)}", soft_wrap=True)


def _settle(gate: GateResult, names: Callable[[str], str]) -> str:
    """What would settle a gate's inconclusive rows: the reference steps (a setting of capture's,
    spelled by ``names``), or nothing but a quieter machine."""
    steps, stuck = gate.steps_needed
    how = []
    if steps is not None:
        how.append(Words("capture both runs with ", Setting("reference_steps"), f" {steps} to settle "
                         f"{len(gate.inconclusive) - len(stuck)} of them").render(names))
    if stuck:
        how.append(f"{len(stuck)} no step count settles (a quieter machine, or a larger threshold)")
    return "; ".join(how) or "time more steps, or a quieter machine"


def _grouped(lines: list[str]) -> list[str]:
    """"v phase size: why" lines with the same variant and reason as one line naming the points."""
    by: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        point, _, why = line.partition(": ")
        variant, _, where = point.partition(" ")
        by.setdefault((variant, why), []).append(where)
    return [f"{v} ({', '.join(points)}): {why}" for (v, why), points in by.items()]


@register("junit", GATE_RESULT)
class GateJunit:
    """The JUnit XML report, written atomically to ``out.path`` and named on the console."""

    writes_file = True

    def __init__(self, base: str, new: str) -> None:
        self.base, self.new = base, new

    def render(self, result: GateResult, out: Output) -> None:
        from kvprof.core.atomic import atomic_write_text
        from kvprof.report.gate import junit_xml

        path = out.need_path()
        atomic_write_text(path, junit_xml(result, base=self.base, new=self.new))
        print(f"wrote {path}", file=out.console.file if out.console is not None else sys.stdout)


__all__ = ["ANALYSIS", "GATE_RESULT", "ComparisonDoc", "Output", "Renderer", "ResultType", "RunComparisonDoc",
           "VariantComparisonDoc", "formats", "get_renderer", "names", "register", "render", "result_key"]
