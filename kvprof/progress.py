"""A progress bar for long captures (rich), silent when stderr is not a terminal."""

from __future__ import annotations

import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """The three calls capture makes: describe the current variant, advance a step, close."""

    def __init__(self, total: int, enabled: bool | None = None) -> None:
        enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress = Progress(
            TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            transient=True, disable=not enabled,
        )
        self._task = self._progress.add_task("capture", total=total)
        self._progress.start()

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()
