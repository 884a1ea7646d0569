"""Ctrl-C as an exception whose exit code we choose.

CPython remembers a ``KeyboardInterrupt`` that escapes any ``exec()`` of a string
(dataclasses, namedtuples and torch build functions that way) and, under ``python -m``,
kills the process with SIGINT at exit even when the interrupt was caught: ``python -m
kvprof`` then ended by signal (-2) instead of 130, at random, depending on where the
signal landed. CPython only remembers the exact type, so raising a subclass while a command
runs keeps the exit code ours.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a kvprof command; caught like any KeyboardInterrupt."""


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


@contextmanager
def ctrl_c_raises_interrupted() -> Iterator[None]:
    """Within the block, SIGINT raises ``Interrupted``; a handler someone else set is kept."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
