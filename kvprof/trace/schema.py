"""The one normalized event table every trace reader produces.

Readers (Kineto JSON, Nsight Systems SQLite) turn their source into this table; the
attribution step fills the write columns; metrics and the dashboard read only this.
Strings are dictionary-encoded (Arrow's symbol table), times are integer nanoseconds on
the source's own clock, missing integers are -1 and missing strings null.

| column      | type          | meaning                                                        |
|-------------|---------------|----------------------------------------------------------------|
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
"""

from __future__ import annotations

import pyarrow as pa

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

# How a GPU row was tied to a kvprof write:
#   range        - the row is itself a kvprof range (host annotation)
#   correlation  - its launching runtime call lies inside the write's host range
#   graph_node   - replayed graph node, tied through the range open when the node was captured
#   graph_order  - replayed graph kernel, tied by its fixed position within the replay
ATTRIBUTION_METHODS = ("range", "correlation", "graph_node", "graph_order")

_DICT = pa.dictionary(pa.int32(), pa.string())

SCHEMA = pa.schema(
    [
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
    ]
)

COLUMNS = tuple(SCHEMA.names)

# kvprof's own range names, shared by the instrumentation that writes them and the
# readers that parse them back.
NVTX_DOMAIN = "kvprof"
WRITE_RANGE_FORMAT = "set_kv_buffer[{variant}] L{layer}"
WRITE_RANGE_PATTERN = r"^set_kv_buffer\[(?P<variant>[^\]]+)\] L(?P<layer>\d+)$"
STEP_RANGE_FORMAT = "kvprof.step[{phase} {size_key}={size}] #{step}"
STEP_RANGE_PATTERN = (
    r"^kvprof\.step\[(?P<phase>\w+) (?P<size_key>bs|tokens)=(?P<size>\d+)\] #(?P<step>\d+)$"
)
PHASE_RANGE_FORMAT = "kvprof.phase[{phase} {size_key}={size}]"
PHASE_RANGE_PATTERN = r"^kvprof\.phase\[(?P<phase>\w+) (?P<size_key>bs|tokens)=(?P<size>\d+)\]$"
