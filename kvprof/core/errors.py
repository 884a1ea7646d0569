"""Errors a user can cause, each mapped to one line on stderr and a defined exit code.

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable


class Setting:
    """A setting a message names (a capture's ``layers``, a command's ``max_memory_gb``): by its
    field name as the Python API spells it, and by its option on the command line, which only
    ``kvprof.commands`` knows (``Words.render`` with its names)."""

    __slots__ = ("field",)

    def __init__(self, field: str) -> None:
        self.field = field

    def __str__(self) -> str:
        return self.field

    def __repr__(self) -> str:
        return f"Setting({self.field!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Setting) and other.field == self.field

    def __hash__(self) -> int:
        return hash(self.field)


class Words(str):
    """Text whose parts may name settings: as a ``str``, each setting by its field name; with
    ``render(name)``, by whatever ``name`` makes of the field (the command line: its flag)."""

    parts: tuple[object, ...]

    def __new__(cls, *parts: object) -> Words:
        text = super().__new__(cls, "".join(map(str, parts)))
        text.parts = parts
        return text

    def render(self, name: Callable[[str], str]) -> str:
        return "".join(name(p.field) if isinstance(p, Setting) else rendered(p, name) for p in self.parts)


def rendered(message: object, name: Callable[[str], str]) -> str:
    """``message`` (text, ``Words`` or a ``KvprofError`` built from parts) with each setting it
    names spelled by ``name``."""
    if isinstance(message, KvprofError) and message.words is not None:
        return message.words.render(name)
    if isinstance(message, Words):
        return message.render(name)
    return str(message)


# around a setting's field in text that crosses a process (a rank's error record): what
# ``decoded`` reads back into ``Words``
_MARK = "\x00"  # not whitespace: a record's line is split and joined on whitespace


def encoded(message: object) -> str:
    """``message`` as one string that keeps which parts name settings (``decoded`` reads it)."""
    return rendered(message, lambda f: f"{_MARK}{f}{_MARK}")


def decoded(text: str) -> Words:
    """The ``Words`` an ``encoded`` string was made from."""
    return Words(*(Setting(part) if i % 2 else part for i, part in enumerate(text.split(_MARK))))


class KvprofError(Exception):
    """A problem with the user's input or machine, reported as one line.

    Built from parts, some of them ``Setting``s (``UsageError(Setting("warmup"), " must be >= 0")``),
    it names each setting by its field (``str``) until the command line renders it with its
    flags (``rendered``); built from one string, it is a plain exception."""

    exit_code = 1
    words: Words | None = None

    def __init__(self, *args: object) -> None:
        if args and all(isinstance(a, (str, Setting)) for a in args) and (
                len(args) > 1 or isinstance(args[0], (Setting, Words))):
            self.words = args[0] if len(args) == 1 and isinstance(args[0], Words) else Words(*args)
            super().__init__(str(self.words))
        else:
            super().__init__(*args)


class UsageError(KvprofError):
    """Unknown model, variant, device or option."""

    exit_code = 2


class ResourceError(UsageError):
    """Sizes that would take more memory (or a larger trace) than the limit allows."""


class TraceError(KvprofError):
    """A trace or export that cannot be read (corrupt, truncated, not a trace)."""

    exit_code = 3


class DeviceError(KvprofError):
    """The machine cannot do what was asked (no GPU, variant not runnable here)."""

    exit_code = 4


class ToolError(KvprofError):
    """An external tool (nsys, its importer, a compiler) is missing or failed."""

    exit_code = 5


class OutputError(KvprofError):
    """The output location cannot be written."""

    exit_code = 6


class WrongWriteError(KvprofError):
    """``verify`` found a write that left wrong bytes in a cache (or refused a call and still
    changed it): a writer's bug, not the user's input."""

    exit_code = 9

# compare --fail-if-slower (kvprof.analysis.gate): the gate's verdicts other than "passed" (0)
GATE_REGRESSED_EXIT_CODE = 1  # a row is slower than BASE by more than the threshold beyond the noise
GATE_NOT_JUDGED_EXIT_CODE = 7  # the runs cannot be compared, or no row could be judged
GATE_INCONCLUSIVE_EXIT_CODE = 8  # no row regressed, and a row's noise exceeds the threshold: too noisy to judge

INTERRUPTED_EXIT_CODE = 130  # Ctrl-C (SIGINT)
TERMINATED_EXIT_CODE = 143  # SIGTERM
