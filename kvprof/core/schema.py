"""The one normalized event table every trace reader produces.

Readers (Kineto JSON, Nsight Systems SQLite) turn their source into this table; the
attribution step fills the write columns; metrics and the dashboard read only this.
Strings are dictionary-encoded (Arrow's symbol table), times are integer nanoseconds on
the source's own clock, missing integers are -1 and missing strings null.

| column      | type          | meaning                                                        |
|-------------|---------------|----------------------------------------------------------------|
| trace       | dict<string>  | the file the row was read from                                 |
| source      | dict<string>  | "kineto" or "nsys"                                             |
| rank        | int32         | distributed rank (0 when the trace has none)                   |
| pid         | int64         | host process id (GPU rows: the process that launched them)     |
| tid         | int64         | host thread id (GPU rows: -1)                                  |
| device      | int32         | GPU index; -1 for host rows                                    |
| stream      | int64         | CUDA stream id; -1 for host rows                               |
| kind        | dict<string>  | one of KINDS                                                   |
| name        | dict<string>  | kernel / call / range name                                     |
| start_ns    | int64         | start, ns                                                      |
| dur_ns      | int64         | duration, ns (>= 0)                                            |
| correlation | int64         | launch <-> kernel correlation id; -1 if none                   |
| graph_node  | int64         | CUDA graph node id where the source records it; -1 otherwise   |
| grid        | dict<string>  | "x,y,z" for kernels, null otherwise                            |
| block       | dict<string>  | "x,y,z" for kernels, null otherwise                            |
| bytes       | int64         | bytes for memcpy/memset; -1 otherwise                          |
| payload     | int64         | NVTX payload of a range (kvprof: tokens); -1 otherwise         |
| write_id    | int64         | the kvprof write this row belongs to; -1 if none               |
| variant     | dict<string>  | writer variant of that write                                   |
| layer       | int32         | layer of that write; -1                                        |
| tokens      | int32         | tokens of that write; -1                                       |
| phase       | dict<string>  | "decode" / "prefill" / ... of the enclosing kvprof step        |
| size        | int32         | batch size (decode) or chunk tokens (prefill) of that step; -1 |
| step        | int32         | step index within its phase and size; -1                       |
| attribution | dict<string>  | how the row was tied to its write: one of ATTRIBUTION_METHODS  |
| domain      | dict<string>  | NVTX domain of a range (nsys); null for Kineto and non-ranges  |
| category    | dict<string>  | NVTX category name of a range (kvprof: the variant); null      |
| graph_launch| int64         | correlation id of the cudaGraphLaunch that replayed the row; -1|

Kinds (``kind``), and what each source maps to them:

| kind           | Kineto ``cat``                | nsys table / rows                                   |
|----------------|-------------------------------|-----------------------------------------------------|
| kernel         | kernel                        | CUPTI_ACTIVITY_KIND_KERNEL                          |
| memcpy         | gpu_memcpy                    | CUPTI_ACTIVITY_KIND_MEMCPY                          |
| memset         | gpu_memset                    | CUPTI_ACTIVITY_KIND_MEMSET                          |
| runtime        | cuda_runtime                  | CUPTI_ACTIVITY_KIND_RUNTIME, names ``cuda*``        |
| driver         | cuda_driver                   | CUPTI_ACTIVITY_KIND_RUNTIME, names ``cu*`` (driver) |
| cpu_op         | cpu_op                        | -                                                   |
| cpu_annotation | user_annotation               | NVTX_EVENTS push/pop (59) and start/end (60) ranges |
| gpu_annotation | gpu_user_annotation           | -                                                   |
| sync           | cuda_sync                     | CUPTI_ACTIVITY_KIND_SYNCHRONIZATION                 |
| other          | any other complete event      | -                                                   |

Kineto ``python_function`` events (with_stack) and flow/metadata/instant events are not
rows; flows (``ac2g``) only supply a correlation id where a GPU event lacks one.
nsys runtime names lose their ``_v<version>`` suffix (``cudaGraphLaunch_v10000`` ->
``cudaGraphLaunch``) so both sources name calls alike.

GPU rows (``GPU_KINDS``) carry ``device`` and ``stream``; host rows carry ``pid``/``tid``.
Times: Kineto ``ts``/``dur`` (microseconds, float) become integer ns by rounding; the
``clock`` of a loaded trace (kvprof.trace.model.Trace) says what the origin is.
"""

from __future__ import annotations

import pyarrow as pa

from kvprof.core.errors import Setting
from kvprof.core.sources import PROFILED, source_names

KINDS = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "driver",
    "cpu_op",
    "cpu_annotation",
    "gpu_annotation",
    "sync",
    "other",
)

# How a row was tied to a kvprof write:
#   range        - the row is a kvprof write range, or a host call made inside one (same thread)
#   correlation  - its launching runtime call lies inside the write's host range
#   graph_node   - replayed graph node, tied through the range open when the node was captured
#   graph_order  - replayed graph kernel, tied by its fixed position within the replay
ATTRIBUTION_METHODS = ("range", "correlation", "graph_node", "graph_order")

SOURCES = source_names(PROFILED)

# Rows that run on the GPU, and the subset that does work a write is measured by.
GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
GPU_WORK_KINDS = ("kernel", "memcpy", "memset")
# Host calls that launch GPU work (their correlation id is shared with what they launched).
LAUNCH_KINDS = ("runtime", "driver")
# The graph-launch calls of the CUDA runtime and driver and of HIP (a ROCm torch.profiler trace
# names its runtime rows hip*), each with its per-thread-default-stream variant.
GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch",
                      "cudaGraphLaunch_ptsz", "cuGraphLaunch_ptsz", "hipGraphLaunch_spt")

_DICT = pa.dictionary(pa.int32(), pa.string())

SCHEMA = pa.schema(
    [
        ("trace", _DICT),
        ("source", _DICT),
        ("rank", pa.int32()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int64()),
        ("kind", _DICT),
        ("name", _DICT),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("graph_node", pa.int64()),
        ("grid", _DICT),
        ("block", _DICT),
        ("bytes", pa.int64()),
        ("payload", pa.int64()),
        ("write_id", pa.int64()),
        ("variant", _DICT),
        ("layer", pa.int32()),
        ("tokens", pa.int32()),
        ("phase", _DICT),
        ("size", pa.int32()),
        ("step", pa.int32()),
        ("attribution", _DICT),
        ("domain", _DICT),
        ("category", _DICT),
        ("graph_launch", pa.int64()),
    ]
)

# Events a trace may hold before a reader refuses it (memory bound: ~100 bytes a row in the
# table, several times that while parsing). ``--max-events`` overrides it.
DEFAULT_MAX_EVENTS = 4_000_000
MAX_EVENTS = Setting("max_events")  # the setting that raises it (kvprof.api.open_run's max_events)
# JSON values one parse may create, per allowed event (DEFAULT_MAX_EVENTS x 4 = 16M values, at
# most ~125 bytes each once parsed: ~2 GB). torch.profiler's traces, one event per line, are
# parsed in pieces of 50,000 events (~23 values each), far below it; a trace in another layout
# is parsed whole, which admits ~700,000 events of that size at the default.
JSON_VALUES_PER_EVENT = 4

# Decompressed bytes of one trace before a reader refuses it: a small .json.gz can hold
# gigabytes. Kineto writes 200-500 bytes per event: 1 GiB holds 2-4 million events, about
# what DEFAULT_MAX_EVENTS admits, and 8x the largest traces kvprof is benchmarked on (120 MB).
# The environment variable raises or lowers it (MiB).
DEFAULT_MAX_TRACE_MB = 1024
MAX_TRACE_MB_ENV = "KVPROF_MAX_TRACE_MB"


def max_trace_bytes() -> int:
    """The decompressed size limit: ``KVPROF_MAX_TRACE_MB`` (MiB) when set, else the default."""
    import os

    from kvprof.core.errors import UsageError

    text = os.environ.get(MAX_TRACE_MB_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_TRACE_MB << 20
    try:
        mb = float(text)
    except ValueError:
        mb = float("nan")
    if not (0 < mb < 1 << 40):  # NaN fails too
        raise UsageError(f"{MAX_TRACE_MB_ENV}={text!r}: expected a positive size in MiB")
    return int(mb * (1 << 20))

# Defaults of the columns a reader leaves unset (integers -1, strings null).
INT_COLUMNS = tuple(f.name for f in SCHEMA if pa.types.is_integer(f.type))
STRING_COLUMNS = tuple(f.name for f in SCHEMA if pa.types.is_dictionary(f.type))

COLUMNS = tuple(SCHEMA.names)
