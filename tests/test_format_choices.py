"""``--format``'s choices come from the renderer registry (kvprof.report.renderers.formats).

A command lists the forms its result type renders in, not a tuple of its own: a form
registered for the result is a choice, one that writes a file (junit, html) is an option
of its own, and the order (table first, the default) is the registration's.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

from kvprof.commands import analyze, bench, compare, verify
from kvprof.core.bench_result import BenchResult
from kvprof.core.verify import PdlResult, VerifyResult
from kvprof.report import renderers
from kvprof.report.renderers import ANALYSIS, RunComparisonDoc, VariantComparisonDoc, formats, register, result_key

COMMANDS = Path(__file__).resolve().parent.parent / "kvprof" / "commands"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[Any, Any]:
    saved = dict(renderers._REGISTRY)
    monkeypatch.setattr(renderers, "_REGISTRY", saved)
    return saved


def _choices(module: Any) -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "format" and a.choices is not None)
    return tuple(action.choices)


def test_the_choices_are_the_registrys_forms_in_its_order() -> None:
    assert _choices(analyze) == formats(ANALYSIS) == ("table", "json", "csv")
    assert _choices(compare) == formats(VariantComparisonDoc, RunComparisonDoc) == ("table", "json", "csv")
    assert _choices(verify) == formats(VerifyResult, PdlResult) == ("table", "json")
    assert _choices(bench) == formats(BenchResult) == ("table", "json", "csv")


def test_a_form_registered_for_a_result_becomes_a_choice_and_a_file_form_does_not(registry: dict) -> None:
    @register("markdown", ANALYSIS)
    class Markdown:
        def render(self, result: Any, out: Any) -> None: ...

    @register("pdf", ANALYSIS)
    class Pdf:
        writes_file = True

        def render(self, result: Any, out: Any) -> None: ...

    @register("yaml", RunComparisonDoc)  # one comparison only: not a choice of compare, which prints either
    class Yaml:
        def render(self, result: Any, out: Any) -> None: ...

    assert _choices(analyze) == ("table", "json", "csv", "markdown")
    assert _choices(compare) == ("table", "json", "csv")
    parser = argparse.ArgumentParser()
    analyze.add_arguments(parser)
    assert "one json / csv / markdown document" in parser.format_help()


def test_every_result_named_by_string_is_that_type() -> None:
    """ANALYSIS and GATE_RESULT spare the parser pandas; each names a class that exists, and a
    result of it finds its renderers."""
    keys = {key for key, _ in renderers._REGISTRY}
    assert {ANALYSIS, renderers.GATE_RESULT} <= keys
    for key in keys:
        module, _, qualname = key.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert isinstance(obj, type) and result_key(obj) == key


def test_no_command_spells_format_choices() -> None:
    """No ``choices=`` literal in kvprof/commands lists a renderer's form."""
    forms = {name for _, name in renderers._REGISTRY}
    found = []
    for f in sorted(COMMANDS.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.keyword) and node.arg == "choices"
                    and isinstance(node.value, (ast.Tuple, ast.List))):
                listed = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
                if listed & forms:
                    found.append(f"{f.name}:{node.lineno} {sorted(listed)}")
    assert found == []
