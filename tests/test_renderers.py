"""The renderer registry (kvprof.report.renderers): each command's output forms by name.

What each form prints is checked by the command tests (test_cli_pipelines.py,
test_compare_gate.py, test_report_html.py, test_formats_doc.py); here, the lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kvprof.analysis.gate import GateResult
from kvprof.analysis.summary import Analysis
from kvprof.core.errors import UsageError
from kvprof.report import renderers
from kvprof.report.renderers import (
    ComparisonDoc,
    Output,
    RunComparisonDoc,
    VariantComparisonDoc,
    get_renderer,
    names,
    register,
    render,
)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[Any, Any]:
    """The registry as it is, restored after the test (its registrations are the test's own)."""
    saved = dict(renderers._REGISTRY)
    monkeypatch.setattr(renderers, "_REGISTRY", saved)
    return saved


def test_every_format_of_analyze_and_compare_has_a_renderer() -> None:
    for result_type in (Analysis, VariantComparisonDoc, RunComparisonDoc):
        assert names(result_type) == ["csv", "json", "table"]
    assert names(GateResult) == ["junit", "table"]
    # the two comparisons print their own tables and share the document forms
    assert type(get_renderer("table", VariantComparisonDoc)) is not type(get_renderer("table", RunComparisonDoc))
    assert type(get_renderer("json", RunComparisonDoc)) is type(get_renderer("json", VariantComparisonDoc))


def test_an_unknown_form_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(UsageError) as exc:
        get_renderer("yaml", Analysis)
    assert str(exc.value) == "no 'yaml' output for Analysis (one of: csv, json, table)"


def test_options_reach_the_renderer(tmp_path, capsys) -> None:
    """junit takes the run names; its file is written and named on the console."""
    from kvprof.report.terminal import make_console

    path = tmp_path / "gate.xml"
    render("junit", GateResult(threshold_pct=5.0), Output(console=make_console(), path=path), base="A", new="B")
    text = path.read_text()
    assert '<property name="base" value="A" />' in text and '<property name="new" value="B" />' in text
    assert capsys.readouterr().out == f"wrote {path}\n"


def test_a_second_renderer_for_the_same_form_is_refused(registry) -> None:
    @dataclass
    class Thing:
        n: int

    @register("text", Thing)
    class ThingText:
        def render(self, result: Thing, out: Output) -> None:
            print(f"thing {result.n}")

    with pytest.raises(ValueError, match="already registered"):
        @register("text", Thing)
        class OtherText:  # noqa: F841
            def render(self, result: Thing, out: Output) -> None: ...

    register("text", Thing)(ThingText)  # the same class again (a module imported anew) is not a second one
    assert type(get_renderer("text", Thing)) is ThingText


def test_a_subclass_finds_its_bases_renderer(registry, capsys) -> None:
    @dataclass(frozen=True)
    class Other(ComparisonDoc):
        pass

    render("csv", Other({"rows": [{"variant": "a", "cost": 1.5}]}), Output())
    assert capsys.readouterr().out == "variant,cost\na,1.5\n"


def test_a_renderer_that_needs_a_console_or_a_path_says_so() -> None:
    with pytest.raises(ValueError, match="console"):
        render("table", GateResult(threshold_pct=5.0), Output())
    with pytest.raises(ValueError, match="path"):
        render("junit", GateResult(threshold_pct=5.0), Output(), base="A", new="B")


def test_the_html_report_registers_its_renderer() -> None:
    pytest.importorskip("plotly")
    from kvprof.dashboard.html_report import HtmlReport
    from kvprof.dashboard.landing import Landing

    assert type(get_renderer("html", Landing)) is HtmlReport
