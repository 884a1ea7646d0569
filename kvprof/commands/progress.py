"""Progress displays for long commands (rich), silent when stderr is not a terminal."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """The three calls capture and bench make: describe what runs now, advance a step, close.

    ``total`` None: a bar without an end yet (``set_total`` gives it one once known), so a
    command can say what it is doing (loading torch, building writers) before it knows how
    many steps there are. ``width``: the characters of the description's column.
    """

    def __init__(self, total: int | None, enabled: bool | None = None, *, description: str = "capture",
                 width: int = 14) -> None:
        enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress = Progress(
            TextColumn(f"{{task.description:>{width}}}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            transient=True, disable=not enabled, console=Console(stderr=True),
        )
        self._task = self._progress.add_task(description, total=total)
        self._progress.start()

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def set_total(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()
