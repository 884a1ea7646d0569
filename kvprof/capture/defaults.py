"""The capture's device-dependent defaults, torch-free so that ``capture --help`` can show
them without importing torch (``kvprof.capture.config`` applies them)."""

from __future__ import annotations

# Layers a step writes on a CPU unless --layers says: a first run there has to finish in
# seconds, and under Triton's interpreter one write takes milliseconds. Per-write figures
# do not depend on the count; per-step projections use the model's (CaptureConfig.layers).
CPU_DEFAULT_LAYERS = 2
# torch's CPU threads during a CPU capture unless --threads says: the writes are small, and a
# second thread on a shared machine made a 64-token write's time swing by orders of magnitude.
CPU_DEFAULT_THREADS = 1

__all__ = ["CPU_DEFAULT_LAYERS", "CPU_DEFAULT_THREADS"]
