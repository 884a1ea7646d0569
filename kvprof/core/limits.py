"""The bounds kvprof holds its inputs to, wherever they come from: the command line's argument
types (``kvprof.commands.argtypes``) refuse what is outside them at the argument, and the torch side's
checks (``kvprof.kvcache.guards``) hold a configuration from the Python API to the same ones."""

from __future__ import annotations

import os

# what JSON outputs (orjson), numpy and torch hold: a larger count ended in "Integer exceeds 64-bit range"
INT64_MAX = 2**63 - 1
# torch's generators take a seed in [0, 2**64); kvprof derives further seeds by adding small
# offsets (a layer, a bench point), so a seed stays within int64 to leave them room
SEED_MAX = INT64_MAX
# more torch threads than this many per CPU only contend; 100,000 crashed torch's pool
THREADS_PER_CPU = 4
# a memory limit above this (1 PiB) is no limit any machine has, and bytes overflow past 1e308 GB
MAX_MEMORY_GB = 1 << 20
# a K/V scale and its inverse are float32 on the device: both must be finite and non-zero there
SCALE_MIN, SCALE_MAX = 2.0**-126, 2.0**127


def cpu_count() -> int:
    """CPUs this process may run on (its affinity where the OS tells, else all of them)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_threads() -> int:
    return THREADS_PER_CPU * cpu_count()
