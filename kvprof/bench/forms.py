"""``kvprof bench``'s result (kvprof.core.bench_result.BenchResult) in each output form,
registered in kvprof.report.renderers like every other command's result.

Light to import: the bench command's parser reads these forms for ``--format``. The table
and the CSV are kvprof.bench.render's, imported when a result is rendered (it brings torch).
"""

from __future__ import annotations

from kvprof.core.bench_result import BenchResult
from kvprof.report.renderers import Output, register


@register("table", BenchResult)
class BenchTable:
    """The limits, a table per mode and field, the reasons and the verdicts."""

    def render(self, result: BenchResult, out: Output) -> None:
        from kvprof.bench.render import render_table

        render_table(result, out.need_console())


@register("json", BenchResult)
class BenchJson:
    """bench.json's document on stdout."""

    def render(self, result: BenchResult, out: Output) -> None:
        from kvprof.report.terminal import print_json

        print_json(result.to_json())


@register("csv", BenchResult)
class BenchCsv:
    """bench.csv's table on stdout."""

    def render(self, result: BenchResult, out: Output) -> None:
        from kvprof.bench.render import to_csv
        from kvprof.report.terminal import print_text

        print_text(to_csv(result))


__all__ = ["BenchCsv", "BenchJson", "BenchTable"]
