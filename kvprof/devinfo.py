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
from kvprof.core.errors import DeviceError, UsageError

# HBM bandwidth from the vendors' datasheets (GB/s), by the name torch reports: only a check
# on the figure computed from the device's own attributes (memory clock x bus width).
# Neither is a measurement: `kvprof bench` measures the device-to-device copy rate itself.
DATASHEET_BANDWIDTH_GBS = {
    "NVIDIA H200": 4800.0,
    "NVIDIA H100 80GB HBM3": 3350.0,
    "NVIDIA H100": 3350.0,
    "NVIDIA A100-SXM4-80GB": 2039.0,
    "NVIDIA A100-SXM4-40GB": 1555.0,
    "NVIDIA B200": 8000.0,
}


# kvprof's modules that decorate Triton kernels (@triton.jit) a capture or bench may run
TRITON_WRITER_MODULES = ("kvprof.writers.triton_convert", "kvprof.writers.triton_kernel", "kvprof.writers.paged_triton",
                         "kvprof.writers.mla_triton", "kvprof.writers.fp8_jit")


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
            raise DeviceError(f"--device {name} asked for, but {why} (torch {torch.__version__})")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise UsageError(f"unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    if device.index not in (None, 0):  # torch has one CPU device; cpu:0 is it
        raise UsageError(f"--device {name}: there is one CPU device, cpu (or cpu:0)")
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
    info.update(peak_bandwidth(p.name, _memory_attributes(device.index if device.index is not None else 0)))
    return info


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
    """Theoretical DRAM bandwidth: 2 transfers per memory clock x bus width, the datasheet beside it.

    The device's attributes work for any GPU; the datasheet figure (a few GPUs) is recorded as
    a check and used only when the driver does not report the attributes.
    """
    datasheet = DATASHEET_BANDWIDTH_GBS.get(name)
    out: dict[str, Any] = {"peak_bandwidth_datasheet_gbs": datasheet}
    if memory and memory[0] > 0 and memory[1] > 0:
        clock_khz, bus_bits = memory
        out.update(memory_clock_khz=clock_khz, memory_bus_width_bits=bus_bits,
                   peak_bandwidth_gbs=round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, 1),
                   peak_bandwidth_source="device attributes (2 x memory clock x bus width)")
    else:
        out.update(peak_bandwidth_gbs=datasheet, peak_bandwidth_source="datasheet" if datasheet else None)
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
