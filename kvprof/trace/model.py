"""What a reader hands on: the event table plus what the source said about itself.

One ``Trace`` per input file. Readers fill ``events`` (write columns unset), the
metadata, ``devices`` and ``clock``; attribution returns a copy with the write columns
filled and ``attribution`` summarised. Warnings are sentences meant for the user, kept
with the trace so that every report shows them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from kvprof.core.run import TraceMeta


@dataclass
class Trace:
    events: pa.Table  # kvprof.core.schema.SCHEMA
    source: str  # "kineto" | "nsys"
    path: str
    kvprof: TraceMeta | None = None  # capture metadata (the trace's "kvprof" key); None: foreign trace
    devices: list[dict[str, Any]] = field(default_factory=list)  # id, name, sms, peak_bandwidth_gbs
    clock: dict[str, Any] = field(default_factory=dict)  # unit, form, base/epoch offsets
    warnings: list[str] = field(default_factory=list)
    attribution: dict[str, Any] = field(default_factory=dict)  # filled by attribution.attribute
    stats: dict[str, Any] = field(default_factory=dict)  # reader counters (skipped events, ...)
    graph_nodes: pd.DataFrame | None = None  # nsys: node, original, start_ns, pid, tid
    writes: pd.DataFrame | None = None  # attribution: one row per write (see attribution.WRITE_INDEX_COLUMNS)
    steps: pd.DataFrame | None = None  # attribution: one row per kvprof step range

    def replace(self, **changes: Any) -> Trace:
        return dataclasses.replace(self, **changes)

    @property
    def is_kvprof(self) -> bool:
        """Made by kvprof's capture (has its metadata) rather than a foreign trace."""
        return self.kvprof is not None

    @property
    def variants(self) -> list[str]:
        if self.kvprof and self.kvprof.variant:
            return [self.kvprof.variant]
        col = self.events.column("variant")  # distinct values first: a row-by-row list took 50 ms per 75k rows
        return sorted({v for v in col.unique().to_pylist() if v}) if self.events.num_rows else []
