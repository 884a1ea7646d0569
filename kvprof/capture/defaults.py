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

# What --context layer runs on a GPU unless told: an engine's decode context and prefill chunk.
DEFAULT_DECODE_SIZES = (1, 10, 64)
DEFAULT_CONTEXT_LEN = 4096
DEFAULT_PREFILL_TOKENS = 4096
# ... and on a CPU, where a 70B rank's layer is ~107 M weights a token pushes through one
# torch thread (a 4096-token prefill step takes minutes, a batch of 64 half a second for two
# layers): smaller batches, a short context and prefill, and few reference steps per mode,
# so that a first run ends within two minutes with the decoder layers still around every
# write. Each one is a default only: the option sets it.
CPU_LAYER_DECODE_SIZES = (1, 10)
CPU_LAYER_CONTEXT_LEN = 256
CPU_LAYER_PREFILL_TOKENS = 16
CPU_LAYER_REFERENCE_STEPS = 3
# On a CPU, unless --reference-steps says: after those first steps (the --steps count, or
# CPU_LAYER_REFERENCE_STEPS), a point's reference pass goes on timing steps while its timed steps
# have taken less than CPU_REFERENCE_BUDGET_S, up to CPU_REFERENCE_STEPS_UP_TO. A decode step of
# a compiled writer takes microseconds, so it gets all of them for a fraction of a second; a step
# under Triton's interpreter or inside a decoder layer takes tens of milliseconds and stops near
# the first ones. The regression gate needs them on a loaded CPU: over 10 steps it leaves more
# real regressions inconclusive (docs/formats.md has the measurement).
CPU_REFERENCE_STEPS_UP_TO = 100
CPU_REFERENCE_BUDGET_S = 0.5

__all__ = ["CPU_DEFAULT_LAYERS", "CPU_DEFAULT_THREADS", "CPU_LAYER_CONTEXT_LEN", "CPU_LAYER_DECODE_SIZES",
           "CPU_LAYER_PREFILL_TOKENS", "CPU_LAYER_REFERENCE_STEPS", "CPU_REFERENCE_BUDGET_S",
           "CPU_REFERENCE_STEPS_UP_TO", "DEFAULT_CONTEXT_LEN", "DEFAULT_DECODE_SIZES",
           "DEFAULT_PREFILL_TOKENS"]
