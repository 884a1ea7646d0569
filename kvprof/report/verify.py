"""``kvprof verify``'s result as a table (per writer: cases by outcome; each failing case with
its reproduction) or as one JSON document; registered with ``kvprof.report.renderers``."""

from __future__ import annotations

from collections.abc import Callable

from kvprof.core.errors import Setting, Words
from kvprof.core.text import markup
from kvprof.core.verify import FAILING, CaseReport, PdlResult, VerifyResult
from kvprof.report.renderers import Output, register


def verdict_line(result: VerifyResult) -> str:
    """The run in one line: what passed, what failed, what the budget left out."""
    tested = [w for w in result.writers if w.skipped is None]
    ran = sum(1 for w in tested if w.cases)
    where = f"{result.device}{' (Triton interpreted)' if result.interpreted else ''}"
    head = (f"verify: {result.cases_run} cases of {ran} writers on {where} in {result.elapsed_s:.1f} s "
            f"(seed {result.seed})")
    if result.budget_hit:
        left = sum(max(0, result.cases_per_writer - w.cases) for w in tested)
        head += f"; the budget of {result.budget_s:g} s ran out with {left} cases not run"
    if not result.passed:
        bad = sorted({w.writer for w in result.writers if w.failed})
        return f"{head}; FAILED: {result.failed} cases wrong or in error ({', '.join(bad)})"
    if result.untested:
        return f"{head}; NOT VERIFIED: {', '.join(w.writer for w in result.untested)} ran no case"
    return f"{head}; passed: every byte as the reference writes it, or refused with nothing changed"


def case_lines(c: CaseReport) -> list[str]:
    size = f" {c.wrong_rows} rows, {c.wrong_bytes} bytes wrong" if c.outcome == "wrong" else ""
    return [f"{c.outcome}: {c.layout}/{c.writer} case {c.index}{size}: {c.detail}",
            f"  case: {c.case}", f"  rerun: {c.reproduce}"]


@register("table", VerifyResult)
class VerifyTable:
    """One row per writer run (cases, ok, refused, wrong, errors, seconds), a line per writer
    that cannot run here (why), then each failing case in three lines (what, the case, the command that reruns it), then
    the verdict."""

    def render(self, result: VerifyResult, out: Output) -> None:
        from rich.table import Table

        con = out.need_console()
        table = Table(title=f"verify on {result.device}")
        for col in ("layout", "writer", "contract", "cases", "ok", "refused", "wrong", "errors", "s"):
            table.add_column(col, justify="right" if col in ("cases", "ok", "refused", "wrong", "errors", "s")
                             else "left")
        for w in result.writers:
            if w.skipped is not None:
                continue
            wrong = f"[red]{w.wrong}[/red]" if w.wrong else "0"
            errors = f"[red]{w.errors}[/red]" if w.errors else "0"
            table.add_row(w.layout, markup(w.writer), w.contract, str(w.cases), str(w.ok), str(w.refused), wrong,
                          errors, f"{w.seconds:.1f}")
        con.print(table)
        for w in result.writers:
            if w.skipped is not None:
                con.print(markup(f"not run here: {w.layout}/{w.writer}: {w.skipped}"), soft_wrap=True,
                          highlight=False)
        shown = result.failures
        if result.only_case is not None and result.only_case.outcome not in FAILING:
            shown = [result.only_case]
        for c in shown:
            for line in case_lines(c):
                con.print(markup(line), soft_wrap=True, highlight=False)
        con.print(markup(verdict_line(result)), soft_wrap=True, highlight=False)


@register("json", VerifyResult)
class VerifyJson:
    """The result's document (``VerifyResult.to_json``) on stdout."""

    def render(self, result: VerifyResult, out: Output) -> None:
        from kvprof.report.terminal import print_json

        print_json(result.to_json())


def pdl_verdict(result: PdlResult, names: Callable[[str], str] = str) -> str:
    """The PDL check in one line (``names`` spells the setting that asks for it)."""
    ran = [w for w in result.writers if w.skipped is None]
    reads = sum(w.reads for w in ran)
    head = Words("verify ", Setting("pdl"), f": {reads:,} dependent reads after griddepcontrol.wait, {len(ran)} "
                 f"writers on {result.device}, {result.trials} writes per token count "
                 f"{','.join(map(str, result.tokens))}, {result.elapsed_s:.1f} s").render(names)
    if not result.passed:
        bad = ", ".join(f"{w.writer} {w.stale:,}" for w in ran if w.stale)
        return f"{head}; FAILED: {result.stale:,} stale reads ({bad})"
    return f"{head}; 0 stale reads"


@register("table", PdlResult)
class PdlTable:
    """One row per writer: its PDL (its own, or its library's choice), reads, stale reads, seconds."""

    def render(self, result: PdlResult, out: Output) -> None:
        from rich.table import Table

        con = out.need_console()
        table = Table(title=f"PDL visibility on {result.device}")
        for col in ("layout", "writer", "contract", "pdl", "reads", "stale", "s"):
            table.add_column(col, justify="right" if col in ("reads", "stale", "s") else "left")
        for w in result.writers:
            if w.skipped is None:
                stale = f"[red]{w.stale:,}[/red]" if w.stale else "0"
                table.add_row(w.layout, markup(w.writer), w.contract, w.pdl, f"{w.reads:,}", stale, f"{w.seconds:.1f}")
        con.print(table)
        for w in result.writers:
            if w.skipped is not None:
                con.print(markup(f"not run: {w.layout}/{w.writer}: {w.skipped}"), soft_wrap=True, highlight=False)
        con.print(markup(pdl_verdict(result, out.names)), soft_wrap=True, highlight=False)


@register("json", PdlResult)
class PdlJson:
    def render(self, result: PdlResult, out: Output) -> None:
        from kvprof.report.terminal import print_json

        print_json(result.to_json())
