"""kvprof's shared words: the paths a write reports and the NVTX range names it records.

The writers say which path ran (``FUSED``, ``FALLBACK_PREFIX + reason``, ...), the
instrumentation names ranges with these formats, and the readers and the analysis parse
both back. One definition here, so the analysis never needs the torch-side writers.
"""

from __future__ import annotations

# Paths a write can take. ``fused`` is one launch for K and V; anything else is not.
FUSED = "fused"
# One launch rotates q and k (rotary embedding) and stores K and V: also one launch for K+V.
ROPE_FUSED = "fused_into_rope"
TWO_COPIES = "two_copies"
TWO_STREAMS = "two_streams"
COMPILED = "compiled"  # torch.compile's output: the kernel count decides whether it fused
# The rows converted to the cache's dtype by separate kernels (SGLang's generic fp8 write: div_,
# .to), then stored: not one launch, whatever the store's own launch count.
CONVERT_THEN_STORE = "convert_then_store"
FALLBACK_PREFIX = "fallback:"


def is_fused_path(path: str) -> bool:
    """Whether a path stored K and V in one launch (a write fused into the rotary kernel too)."""
    return path == FUSED or path == ROPE_FUSED


def is_rope_fused_path(path: str) -> bool:
    """Whether one launch ran the rotary embedding and the K+V store."""
    return path == ROPE_FUSED


# kvprof's own range names, shared by the instrumentation that writes them and the
# readers that parse them back.
NVTX_DOMAIN = "kvprof"
WRITE_RANGE_FORMAT = "set_kv_buffer[{variant}] L{layer}"
# The family of per-write range names the analysis accepts (kvprof writes the first form;
# an engine annotated by hand may use any of them):
#   set_kv_buffer[<variant>] L<layer>   set_kv_buffer[<variant>]   set_kv_buffer L<layer>
#   set_kv_buffer                       each optionally followed by " tokens=<n>"
# Without [variant] the variant is the range's NVTX category, else the trace's kvprof
# metadata, else "unnamed"; without a layer it is -1; tokens come from the NVTX payload,
# else the name, else the step's size. Ranges that mention set_kv_buffer in any other form
# are counted and named in a warning, never dropped silently.
WRITE_RANGE_PATTERN = (
    r"^(?P<base>set_kv_buffer)(?:\[(?P<variant>[^\]]+)\])?(?: L(?P<layer>\d+))?(?: tokens=(?P<tokens>\d+))?$"
)
WRITE_RANGE_LOOKALIKE = "set_kv_buffer"  # case-insensitive substring of names counted when they do not match
UNNAMED_VARIANT = "unnamed"
STEP_RANGE_FORMAT = "kvprof.step[{phase} {size_key}={size}] #{step}"
STEP_RANGE_PATTERN = (
    r"^kvprof\.step\[(?P<phase>\w+) (?P<size_key>bs|tokens)=(?P<size>\d+)\] #(?P<step>\d+)$"
)
PHASE_RANGE_FORMAT = "kvprof.phase[{phase} {size_key}={size}]"
PHASE_RANGE_PATTERN = r"^kvprof\.phase\[(?P<phase>\w+) (?P<size_key>bs|tokens)=(?P<size>\d+)\]$"
# A CUDA graph's replay, as the SGLang plugin marks it (host range around CUDAGraph.replay): the
# number is the graph's in the plugin's sidecar (``kvprof.core.sidecar.CapturedGraph``), so the
# reader knows which recorded write order the replay's kernels follow.
GRAPH_REPLAY_RANGE_FORMAT = "kvprof.graph_replay[{graph}]"
GRAPH_REPLAY_RANGE_PATTERN = r"^kvprof\.graph_replay\[(?P<graph>\d+)\]$"
