"""What kvprof reads of a Kineto event, and how a value becomes a column: the rules the
per-event loop over orjson's dicts (kvprof.trace.kineto) and the typed decoder
(kvprof.trace.kineto_decode) both apply, so that a trace reads the same through either."""

from __future__ import annotations

from typing import Any

from kvprof.core.schema import KINDS
from kvprof.trace.kineto_io import I64_MAX

# Kineto "cat" -> kvprof kind (see the table in kvprof.core.schema).
KIND_OF_CAT = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "driver",
    "cpu_op": "cpu_op",
    "user_annotation": "cpu_annotation",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_sync": "sync",
}
# Kineto's names before it settled on today's (libkineto's ChromeTraceLogger of 2020-2021, torch
# 1.8-1.9 traces): the same activities, capitalised or named otherwise. Read as today's.
LEGACY_KIND_OF_CAT = {
    "Kernel": "kernel",
    "Memcpy": "memcpy",
    "Memset": "memset",
    "Runtime": "runtime",
    "Operator": "cpu_op",
}
# The ``cat`` of the flow events that bind a launch to its GPU activity: today's, then older ones.
FLOW_CATS = frozenset({"ac2g", "async_gpu", "async"})
# Complete events that are not rows: the profiler's own span, and Python stacks
# (with_stack=True makes them the majority of a trace and kvprof never reads them).
SKIPPED_CATS = frozenset({"Trace", "python_function", "Python"})
# rows whose args carry a device, stream, graph node, grid and block; with ARG_CODES, a correlation
GPU_CODES = frozenset(KINDS.index(k) for k in ("kernel", "memcpy", "memset", "gpu_annotation", "sync"))
ARG_CODES = GPU_CODES | {KINDS.index("runtime"), KINDS.index("driver")}
MEMCPY, MEMSET = KINDS.index("memcpy"), KINDS.index("memset")  # the rows whose args carry bytes
OTHER = KINDS.index("other")
# keyed by str | None: an event without a "cat" is looked up as None (and misses)
CODE_OF_CAT: dict[str | None, int] = {cat: KINDS.index(kind)
                                      for cat, kind in {**LEGACY_KIND_OF_CAT, **KIND_OF_CAT}.items()}
# Categories of complete events named in a note when none of a trace's events is GPU work.
OTHER_CATS_LISTED = 5

# |ts| and dur in microseconds past which ns sums could overflow int64 (3e15 µs: ~95 years)
MAX_US = 3.0e15


def id_or_unknown(v: Any) -> int:
    """An id as int64, -1 when it is missing, not a number, or does not fit (ids >= 2**63)."""
    if v.__class__ is int:
        return v if -I64_MAX <= v <= I64_MAX else -1
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return -1
    return i if -I64_MAX <= i <= I64_MAX else -1



def stream_of_tid(tid: Any) -> Any:
    """A GPU row's stream where its args name none: its tid, which older Kineto wrote as "stream <n>"."""
    if tid.__class__ is str and tid.startswith("stream "):
        return id_or_unknown(tid[7:].strip())
    return tid
