"""What HolisticTraceAnalysis (HTA 0.5) needs from a kvprof trace, in one place.

HTA finds a trace's rank with the regex ``"rank":\\s+(\\d+)`` over the raw text: the
``distributedInfo`` metadata must exist and be written with a space after the colon
(``json.dumps`` does; ``orjson.dumps`` does not, and then HTA falls back to rank 0 with
a warning). HTA maps one trace per rank, so a run folder of several variant traces
(all rank 0) must be opened one file at a time: ``TraceAnalysis(trace_files={0: path})``.
"""

from __future__ import annotations

import json


def hta_metadata_json(rank: int = 0, world_size: int = 1) -> str:
    """The string for ``prof.add_metadata_json("distributedInfo", ...)`` (inside the profile block)."""
    return json.dumps({"backend": "none", "rank": int(rank), "world_size": int(world_size)})
