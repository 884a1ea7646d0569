"""Ctrl-C and SIGTERM as exceptions whose exit code we choose.

CPython remembers a ``KeyboardInterrupt`` that escapes any ``exec()`` of a string
(dataclasses, namedtuples and torch build functions that way) and, under ``python -m``,
kills the process with SIGINT at exit even when the interrupt was caught: ``python -m
kvprof`` then ended by signal (-2) instead of 130, at random, depending on where the
signal landed. CPython only remembers the exact type, so raising a subclass while a command
runs keeps the exit code ours.

SIGTERM (a job scheduler, ``timeout``, ``kill``) raises ``Terminated``, a subclass too, so
the same ``finally`` blocks that remove temporaries on Ctrl-C run for it: without it the
process died where it stood and left a hidden half-written run folder.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a kvprof command; caught like any KeyboardInterrupt."""


class Terminated(Interrupted):
    """SIGTERM during a kvprof command; cleaned up like Ctrl-C, exit code 143."""


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def ctrl_c_raises_interrupted() -> Iterator[None]:
    """Within the block, SIGINT raises ``Interrupted`` and SIGTERM ``Terminated``; a handler
    someone else set is kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    own_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    own_term = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if own_int:
        signal.signal(signal.SIGINT, _raise_interrupted)
    if own_term:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if own_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (a few renames that must happen together).

    Blocked at the thread's signal mask, so a signal that arrives meanwhile is delivered,
    and raises, right after the block, when the set it protects is whole.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
