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

A native extension that runs Python while it initialises (Triton's nanobind module builds
enums; torch's profiler imports Triton when it starts) cannot pass an exception raised
there back out: nanobind/pybind11 throw a C++ exception nothing catches and the process
aborts (SIGABRT, exit -6) instead of exiting 130. So while the handlers are installed, an
extension module's initialisation holds the signal and it is raised the moment the
initialisation returns (``_native_init``).

SIGHUP (a closed terminal or SSH session), SIGQUIT (Ctrl-\\), SIGUSR1, SIGUSR2 and SIGALRM
end a process by default too (SIGQUIT with a core dump), and did so without the cleanup,
leaving the hidden run folder behind: they raise ``Terminated`` as SIGTERM does, with the
exit code 128 + the signal's number.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.machinery import ExtensionFileLoader, ModuleSpec
from types import FrameType, ModuleType


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a kvprof command; caught like any KeyboardInterrupt."""

    signum = signal.SIGINT
    # what the command kept when the signal landed after it had put an output in place, said instead
    # of "nothing half-written was kept" (which is then not the whole story)
    kept: str | None = None


class Terminated(Interrupted):
    """SIGTERM (or another signal whose default ends the process) during a kvprof command;
    cleaned up like Ctrl-C, exit code 128 + the signal's number (143 for SIGTERM)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signal.Signals(signum)

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


# The signals handled like SIGTERM: each ends a process by default (SIGQUIT with a core dump).
TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
                    if hasattr(signal, name))

# Extension modules initialising in the main thread (where Python runs signal handlers), and
# the signal that arrived meanwhile (a terminating one wins over Ctrl-C: it asks for more).
_native_depth = 0
_pending: Interrupted | None = None


def _raise(exc: Interrupted) -> None:
    global _pending
    if _native_depth:
        if _pending is None or isinstance(exc, Terminated):
            _pending = exc
        return
    raise exc


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    _raise(Interrupted())


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    _raise(Terminated(signum))


@contextmanager
def _native_init() -> Iterator[None]:
    """Hold the handled signals while an extension module initialises; raise what came on the way out."""
    global _native_depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _native_depth += 1
    try:
        yield
    finally:
        _native_depth -= 1
        if _native_depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


class _HeldSignalsLoader(ExtensionFileLoader):
    """The standard extension loader, with its two native steps under ``_native_init``."""

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        with _native_init():
            return super().create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _native_init():
            super().exec_module(module)


class _NativeImportFinder:
    """First on ``sys.meta_path`` while the handlers are installed: finds a module the way the
    other finders do and hands an extension module to ``_HeldSignalsLoader``."""

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: ModuleType | None = None) -> ModuleSpec | None:
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is cls or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if type(spec.loader) is ExtensionFileLoader:
                    spec.loader = _HeldSignalsLoader(spec.loader.name, spec.loader.path)
                return spec
        return None


@contextmanager
def ctrl_c_raises_interrupted() -> Iterator[None]:
    """Within the block, SIGINT raises ``Interrupted`` and SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
    SIGUSR2 and SIGALRM raise ``Terminated`` (held while an extension module initialises); a
    handler someone else set is kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    own_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    own = [s for s in TERMINATING if signal.getsignal(s) == signal.SIG_DFL]
    if own_int:
        signal.signal(signal.SIGINT, _raise_interrupted)
    for s in own:
        signal.signal(s, _raise_terminated)
    finder = (own_int or bool(own)) and _NativeImportFinder not in sys.meta_path
    if finder:
        sys.meta_path.insert(0, _NativeImportFinder)
    try:
        yield
    finally:
        if finder and _NativeImportFinder in sys.meta_path:
            sys.meta_path.remove(_NativeImportFinder)
        if own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in own:
            signal.signal(s, signal.SIG_DFL)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and the terminating signals wait until the block ends (a few renames that must
    happen together).

    Blocked at the thread's signal mask, so a signal that arrives meanwhile is delivered,
    and raises, right after the block, when the set it protects is whole.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *TERMINATING})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
