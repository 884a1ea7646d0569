"""sgl-kernel's ``store_kv_cache`` as measured on the card kvprof's bench targets.

The numbers and where they come from are data (``sgl_reference.json`` beside this module):
a run with neither the ``sgl_kernel`` op nor the ``sgl_kernel_cubin`` kernels measured on an
H200 is compared against them, labelled as references, never as its own measurement.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

REFERENCE_FILE = "sgl_reference.json"


@dataclass(frozen=True)
class SglReference:
    source: str
    device_match: str
    graph_us: dict[tuple[str, int], float] = field(default_factory=dict)  # (row shape, tokens) -> µs per write
    eager_host_us: float | None = None  # one eager call of the op, host time per write
    provenance: dict[str, Any] = field(default_factory=dict)

    def applies(self, device_name: str | None) -> bool:
        return bool(device_name) and self.device_match in str(device_name)


@functools.cache
def load() -> SglReference:
    doc = json.loads(resources.files("kvprof.bench").joinpath(REFERENCE_FILE).read_text(encoding="utf-8"))
    return SglReference(source=str(doc["source"]), device_match=str(doc["device_match"]),
                        graph_us={(str(p["shape"]), int(p["tokens"])): float(p["us"]) for p in doc["graph_us"]},
                        eager_host_us=doc.get("eager_host_us"), provenance=dict(doc.get("provenance") or {}))


__all__ = ["REFERENCE_FILE", "SglReference", "load"]
