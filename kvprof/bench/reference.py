"""sgl-kernel's ``store_kv_cache`` as measured on the machine type kvprof's bench targets.

sgl-kernel cannot be installed on the H200 machine kvprof is measured on (no package registry there, and its wheel
pins its own torch), so a run there has no ``sgl_kernel`` column. These are the numbers
measured the same way (CUDA-graph replays of 80 bf16 writes at random slots) on the same
machine type, quoted in the project's ``shared/GPU.md`` (2026-12-02). The bench compares
against them only on an H200, labelled as references, never as its own measurement.
"""

from __future__ import annotations

SOURCE = "sgl-kernel store_kv_cache, H200, CUDA-graph replay, bf16 (shared/GPU.md, 2026-12-02)"
DEVICE_MATCH = "H200"

# (row shape, tokens) -> µs per write, bf16 cache from bf16 input
GRAPH_US: dict[tuple[str, int], float] = {
    ("1x128", 1): 1.49,
    ("1x128", 512): 1.65,
    ("1x128", 32768): 12.2,
    ("8x128", 1): 1.99,
    ("8x128", 512): 2.57,
    ("8x128", 32768): 72.5,
}
EAGER_HOST_US = 8.6  # one eager call of the op, host time per write


def applies(device_name: str | None) -> bool:
    return bool(device_name) and DEVICE_MATCH in str(device_name)
