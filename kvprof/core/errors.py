"""Errors a user can cause, each mapped to one line on stderr and a defined exit code.

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class KvprofError(Exception):
    """A problem with the user's input or machine, reported as one line."""

    exit_code = 1


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
