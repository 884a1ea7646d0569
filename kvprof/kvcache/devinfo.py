"""What a run ran on: library versions and the device's properties, for the manifest."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import kvprof
from kvprof.core.devices import DEVICE_PROPERTIES, SPEC_TABLE, computed_peak_gbs, spec_peak_gbs
from kvprof.core.errors import DeviceError, Setting, UsageError

# kvprof's modules that decorate Triton kernels (@triton.jit) a capture or bench may run, each
# registered by the module itself when it is imported (``decorates_triton_kernels``): the writers
# sit above this module, which names none of them
TRITON_WRITER_MODULES: set[str] = set()


def decorates_triton_kernels(module: str) -> None:
    """Called by a writer module of kvprof's as it is imported, before it decorates its Triton
    kernels (Triton reads ``TRITON_INTERPRET`` then): once it is imported, ``triton_interpreter``
    leaves the variable alone."""
    TRITON_WRITER_MODULES.add(module)


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "on", "yes")


def triton_interpreter(device: torch.device) -> str | None:
    """Set TRITON_INTERPRET=1 on a CPU when it is unset and no Triton writer is imported yet
    (Triton reads it when a kernel is decorated, at import), so that kvprof's Triton writers
    run there on a first try; say where the setting in force came from: "set by kvprof",
    "from the environment", or None (compiled on CUDA, turned off by the user, or too late).
    An explicit value, 0 included, is the user's choice and is kept."""
    value = os.environ.get("TRITON_INTERPRET")
    if value is not None:
        return "from the environment" if _truthy(value) else None
    if device.type == "cuda":
        return None
    if any(m in sys.modules for m in TRITON_WRITER_MODULES):
        # too late for this process (a library user imported a writer first): the writer
        # itself says why it cannot run, and the variant is reported n/a with that reason
        return None
    os.environ["TRITON_INTERPRET"] = "1"
    return "set by kvprof"


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when there is a GPU, else CPU; an explicit 'cuda' on a GPU-less machine is an error."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise DeviceError(Setting("device"), f" {name} asked for, but {why} (torch {torch.__version__})")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceError(Setting("device"), f" {name}: only {torch.cuda.device_count()} GPU(s) visible")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise UsageError(f"unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    if device.index not in (None, 0):  # torch has one CPU device; cpu:0 is it
        raise UsageError(Setting("device"), f" {name}: there is one CPU device, cpu (or cpu:0)")
    return torch.device("cpu")  # without the index: tensors made on "cpu" report no index


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, Any]:
    return {
        "kvprof": kvprof.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "nvtx": _version("nvtx"),
        "sgl_kernel": _version("sgl-kernel"),
        "platform": platform.platform(),
    }


def device_properties(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"type": "cpu", "name": platform.processor() or platform.machine(), "peak_bandwidth_gbs": None}
    p = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = {
        "type": "cuda",
        "index": device.index,
        "name": p.name,
        "capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "total_memory_bytes": p.total_memory,
        "l2_cache_bytes": getattr(p, "L2_cache_size", None),
        "driver": _driver_version(),
    }
    memory = _property_memory(p) or _memory_attributes(device.index if device.index is not None else 0)
    info.update(peak_bandwidth(p.name, memory))
    return info


def _property_memory(props: Any) -> tuple[int, int] | None:
    """(memory clock kHz, bus width bits) from torch's device properties, where this torch has
    them (``memory_clock_rate``, ``memory_bus_width``; CUDA 13 builds may report 0); else None."""
    clock, width = getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
    if isinstance(clock, int) and isinstance(width, int) and clock > 0 and width > 0:
        return clock, width
    return None


# cuDeviceGetAttribute's CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE (kHz) and _GLOBAL_MEMORY_BUS_WIDTH (bits)
_CU_MEMORY_CLOCK_RATE = 36
_CU_GLOBAL_MEMORY_BUS_WIDTH = 37


def _memory_attributes(index: int) -> tuple[int, int] | None:
    """(memory clock kHz, bus width bits) from the CUDA driver, for any NVIDIA GPU; None if unavailable."""
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return None
        clock, width = ctypes.c_int(), ctypes.c_int()
        if (lib.cuDeviceGetAttribute(ctypes.byref(clock), _CU_MEMORY_CLOCK_RATE, dev) != 0
                or lib.cuDeviceGetAttribute(ctypes.byref(width), _CU_GLOBAL_MEMORY_BUS_WIDTH, dev) != 0):
            return None
        return clock.value, width.value
    except (OSError, AttributeError):
        return None


def peak_bandwidth(name: str, memory: tuple[int, int] | None) -> dict[str, Any]:
    """Peak DRAM bandwidth and where it came from: the spec table (NVIDIA's datasheets,
    ``kvprof.core.devices``) for a device it lists, else 2 transfers per memory clock x bus
    width from the device's properties (``memory``: clock kHz, bus bits), else None.

    The figure computed from the properties is recorded beside the table's, as a check.
    """
    spec = spec_peak_gbs(name)
    out: dict[str, Any] = {"peak_bandwidth_datasheet_gbs": spec}
    computed = computed_peak_gbs(*memory) if memory else None
    if computed is not None and memory:
        out.update(memory_clock_khz=memory[0], memory_bus_width_bits=memory[1], peak_bandwidth_computed_gbs=computed)
    if spec is not None:
        out.update(peak_bandwidth_gbs=spec, peak_bandwidth_source=SPEC_TABLE)
    elif computed is not None:
        out.update(peak_bandwidth_gbs=computed, peak_bandwidth_source=DEVICE_PROPERTIES)
    else:
        out.update(peak_bandwidth_gbs=None, peak_bandwidth_source=None)
    return out


def _driver_version() -> str | None:
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    return None


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` within the block (None: unchanged), restored after:
    capture and bench time CPU writes on one thread by default."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
