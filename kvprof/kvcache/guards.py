"""Refuse what would hang, exhaust memory or read something that is not a file, before doing it.

Why a module of its own: every entry point (capture, bench, the pool API) needs the same
two answers -- how much memory will this allocation take, and how much may it take -- and
one place keeps the numbers and the wording the same. (Whether a path is a regular file
is kvprof.core.files, which the torch-free readers use.)

Memory: an estimate is compared with a limit before anything is allocated. The limit is
what the machine can give (80 % of the host's available memory, 90 % of a GPU's free
memory) unless the user sets one (``--max-memory-gb``, or ``KVPROF_MAX_MEMORY_GB`` for the
Python API), which may be higher: the user then takes the risk knowingly. A refusal names
the estimate, the limit and the option.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvprof.core.errors import ResourceError, Setting, UsageError, Words
from kvprof.core.limits import MAX_MEMORY_GB, SEED_MAX, THREADS_PER_CPU, cpu_count, max_threads

if TYPE_CHECKING:
    import torch

    from kvprof.kvcache.models import RankShape
    from kvprof.kvcache.workload import PhaseSpec


class CaptureValues(Protocol):
    """What ``check_capture_values`` reads of a capture's settings as given
    (kvprof.capture.config.CaptureConfig is one): a protocol, so that this module, which the
    pool uses, does not depend on capture."""

    @property
    def run_id(self) -> str | None: ...
    @property
    def phases(self) -> list[str]: ...
    @property
    def pool_size(self) -> int | None: ...
    @property
    def serving_steps(self) -> int | None: ...
    @property
    def seed(self) -> int: ...
    @property
    def threads(self) -> int | None: ...
    @property
    def max_memory_gb(self) -> float | None: ...


class CaptureSizes(Protocol):
    """What ``check_capture`` reads of a resolved capture (kvprof.capture.plan.CapturePlan is one)."""

    @property
    def shape(self) -> RankShape: ...
    @property
    def phases(self) -> Sequence[PhaseSpec]: ...
    @property
    def cache_dtype(self) -> torch.dtype: ...
    @property
    def input_dtype(self) -> torch.dtype: ...
    @property
    def layers(self) -> int: ...
    @property
    def pool_size(self) -> int | None: ...
    @property
    def page_size(self) -> int: ...
    @property
    def warmup(self) -> int: ...
    @property
    def reference_steps(self) -> int: ...
    @property
    def reference_steps_up_to(self) -> int: ...
    @property
    def max_memory_gb(self) -> float | None: ...

ENV_MAX_MEMORY_GB = "KVPROF_MAX_MEMORY_GB"
HOST_FRACTION = 0.8
DEVICE_FRACTION = 0.9
# Profiled writes per variant a capture may record: each write leaves several events, and
# analyze refuses traces over 4,000,000 events by default (kvprof.trace.kineto).
MAX_PROFILED_WRITES = 500_000
# Unprofiled writes per variant (warm-up and reference steps x sizes x layers): each is run and
# the reference steps are timed and kept; 2**63 warm-up steps ran for ever.
MAX_UNPROFILED_WRITES = 20 * MAX_PROFILED_WRITES
# Bytes the profiler keeps per recorded write (ranges, ops, launches), for the estimate.
PROFILER_BYTES_PER_WRITE = 4096
GiB = 1 << 30


# ---------------------------------------------------------------- files


# ---------------------------------------------------------------- memory


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_available_bytes() -> int:
    """Memory the host can give now (MemAvailable; else physical memory)."""
    avail = _meminfo_available()
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            avail = 8 * GiB
    return int(avail)


def _user_limit(max_memory_gb: float | None) -> int | None:
    if max_memory_gb is None:
        env = os.environ.get(ENV_MAX_MEMORY_GB)
        if not env:
            return None
        try:
            max_memory_gb = float(env)
        except ValueError:
            raise UsageError(f"{ENV_MAX_MEMORY_GB}={env!r} is not a number of GB") from None
        source: str = ENV_MAX_MEMORY_GB
    else:
        source = Words(Setting("max_memory_gb"))
    if isinstance(max_memory_gb, bool) or not isinstance(max_memory_gb, (int, float)) \
            or not 0 < max_memory_gb <= MAX_MEMORY_GB:  # nan fails too
        raise UsageError(source, f" must be a positive number of GB up to {MAX_MEMORY_GB}, got {max_memory_gb}")
    return int(max_memory_gb * GiB)


@dataclass(frozen=True)
class MemoryLimit:
    """How many bytes an allocation may take, and where that number came from."""

    bytes: int
    source: str  # for the message: "80% of available host memory", the max_memory_gb setting (Words)


def memory_limit(device: torch.device | str | None = None, max_memory_gb: float | None = None) -> MemoryLimit:
    """The limit for allocations on ``device`` (host memory for CPU or None)."""
    user = _user_limit(max_memory_gb)
    if user is not None:
        return MemoryLimit(user, Words(Setting("max_memory_gb")) if max_memory_gb is not None else ENV_MAX_MEMORY_GB)
    kind = getattr(device, "type", None) or (str(device).split(":")[0] if device is not None else "cpu")
    if kind == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return MemoryLimit(int(free * DEVICE_FRACTION), f"{int(DEVICE_FRACTION * 100)}% of the GPU's free memory")
    return MemoryLimit(int(host_available_bytes() * HOST_FRACTION),
                       f"{int(HOST_FRACTION * 100)}% of the available host memory")


def gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB" if n < 100 * GiB else f"{n / GiB:,.0f} GiB"


def check_memory(estimate: int, limit: MemoryLimit, what: str) -> None:
    """ResourceError (one line: estimate, limit, how to raise it) when ``estimate`` is over."""
    if estimate > limit.bytes:
        raise ResourceError(
            what, f" would need about {gib(estimate)}; the limit is {gib(limit.bytes)} (", limit.source, "). "
            "Lower the sizes, or raise the limit with ", Setting("max_memory_gb"),
            " (KVPROF_MAX_MEMORY_GB for the API)")


def check_layer_weights(per_layer: int, fixed: int, layers: int, limit: MemoryLimit, what: str) -> None:
    """ResourceError when ``layers`` layers of weights (``per_layer`` bytes each, ``fixed``
    once) exceed ``limit``, naming the most layers that fit (``--layers``) or, when not even
    one does, a smaller model or a larger tensor-parallel degree."""
    need = per_layer * layers + fixed
    if need <= limit.bytes:
        return
    fits = (limit.bytes - fixed) // per_layer if per_layer > 0 else 0
    head = Words(what, f" builds {layers} layer{'s' if layers != 1 else ''} of weights, about {gib(need)}; the limit "
                 f"is {gib(limit.bytes)} (", limit.source, ")")
    if fits >= 1:
        raise ResourceError(head, ". ", Setting("layers"), f" {fits} fits ({gib(per_layer * fits + fixed)}); or raise "
                            "the limit with ", Setting("max_memory_gb"))
    raise ResourceError(head, f", and one layer needs {gib(per_layer + fixed)}. Pick a smaller ", Setting("model"),
                        " or a larger ", Setting("tp"), ", or raise the limit with ", Setting("max_memory_gb"))


def pool_bytes(rows: int, layers: int, head_num: int, head_dim: int, v_head_dim: int, elem: int) -> int:
    """Bytes of a KVPool's K and V buffers (Python ints: no overflow for absurd sizes)."""
    return int(rows) * int(layers) * int(head_num) * (int(head_dim) + int(v_head_dim)) * int(elem)


@dataclass(frozen=True)
class CaptureEstimate:
    """What one variant's capture allocates at its peak (variants run one after another)."""

    device_bytes: int  # pool, inputs and slots on the device
    host_bytes: int  # host slot tables and the profiler's record of every write
    profiled_writes: int
    unprofiled_writes: int = 0  # warm-up and reference steps' writes


def capture_estimate(config: CaptureSizes, device: torch.device) -> CaptureEstimate:
    """Estimate a capture's memory from its resolved sizes, without allocating anything."""
    import torch

    from kvprof.kvcache.workload import default_pool_size

    shape = config.shape
    phases = config.phases
    elem = torch.empty((), dtype=config.cache_dtype).element_size()
    in_elem = torch.empty((), dtype=config.input_dtype).element_size()
    dims = shape.head_dim + shape.v_head_dim
    # slots per layer as for the whole model (as the session sizes them), buffers and writes
    # only for the layers a step really writes (--layers; 2 by default on a CPU)
    size = config.pool_size or default_pool_size(phases, shape.head_num, dims, shape.layers, elem, device)
    layers = config.layers
    rows = size + config.page_size
    pool = pool_bytes(rows, layers, shape.head_num, shape.head_dim, shape.v_head_dim, elem)
    slots = sum(p.steps * p.tokens for p in phases) * 8
    inputs = sum(p.tokens for p in phases) * shape.head_num * dims * (in_elem + 4)  # float32 staging too
    writes = sum(p.steps for p in phases) * layers
    unprofiled = (config.warmup + max(config.reference_steps, config.reference_steps_up_to)) * len(phases) * layers
    device_bytes = pool + inputs + slots
    host_bytes = slots + writes * PROFILER_BYTES_PER_WRITE
    return CaptureEstimate(device_bytes, host_bytes, writes, unprofiled)


def check_capture(config: CaptureSizes, device: torch.device) -> CaptureEstimate:
    """Refuse a capture whose trace could not be analysed or whose memory is not there."""
    est = capture_estimate(config, device)
    if est.profiled_writes > MAX_PROFILED_WRITES:
        raise ResourceError(
            f"this capture would profile {est.profiled_writes:,} writes per variant (steps x sizes x layers); "
            f"the limit is {MAX_PROFILED_WRITES:,}, about what analyze loads by default (4,000,000 events). "
            "Lower ", Setting("steps"), ", the sizes or the phases")
    if est.unprofiled_writes > MAX_UNPROFILED_WRITES:
        raise ResourceError(
            f"this capture would run {est.unprofiled_writes:,} unprofiled writes per variant ((", Setting("warmup"),
            " + ", Setting("reference_steps"), f") x sizes x layers); the limit is {MAX_UNPROFILED_WRITES:,}. Lower ",
            Setting("warmup"), " or ", Setting("reference_steps"))
    max_gb = getattr(config, "max_memory_gb", None)
    if device.type == "cuda":
        check_memory(est.device_bytes, memory_limit(device, max_gb), f"the pool and inputs on {device}")
        check_memory(est.host_bytes, memory_limit("cpu", max_gb), "the host side of the capture")
    else:
        check_memory(est.device_bytes + est.host_bytes, memory_limit("cpu", max_gb),
                     "the pool, inputs and profiler records of this capture")
    return est


# ---------------------------------------------------------------- capture values

RUN_ID_MAX = 128
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]*\Z")


def check_run_id(run_id: str) -> str:
    """A run id is one folder name under ``--out``: no separator, no ``..``, no control
    characters, at most 128 characters (a path component may be 255 bytes; temporaries add
    a suffix)."""
    if not isinstance(run_id, str) or not run_id:
        raise UsageError(Setting("run_id"), f" must be a non-empty folder name, got {run_id!r}")
    if len(run_id) > RUN_ID_MAX:
        raise UsageError(Setting("run_id"), f" is {len(run_id)} characters; at most {RUN_ID_MAX}")
    if not _RUN_ID.match(run_id):
        raise UsageError(Setting("run_id"), f" {run_id!r} is not a plain folder name: use letters, digits, '.', '_', "
                         "'+', '-' (no '/', no leading '.' or '-', no spaces or control characters)")
    return run_id


def check_capture_values(config: CaptureValues) -> None:
    """Values that would otherwise be taken quietly (0 as "default", an empty phase list, a path as run id)."""
    if config.run_id is not None:
        check_run_id(config.run_id)
    if not config.phases:
        raise UsageError(Setting("phases"), " names no phase; choose from decode, prefill, serving")
    for name, value in (("pool_size", config.pool_size), ("serving_steps", config.serving_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(Setting(name), f" must be a positive integer, got {value!r}")
    if isinstance(config.seed, bool) or not isinstance(config.seed, int) or not 0 <= config.seed <= SEED_MAX:
        raise UsageError(Setting("seed"), f" must be an integer from 0 to {SEED_MAX}, got {config.seed!r}")
    threads = config.threads
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= max_threads()):
        raise UsageError(Setting("threads"), f" must be from 1 to {max_threads()} ({THREADS_PER_CPU} x {cpu_count()} "
                         f"CPUs), got {threads!r}")
    max_gb = getattr(config, "max_memory_gb", None)
    if max_gb is not None:
        _user_limit(max_gb)
