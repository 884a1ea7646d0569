"""What a run ran on: library versions and the device's properties, for the manifest."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

import torch

import kvprof
from kvprof.core.errors import DeviceError, UsageError

# HBM bandwidth from the vendors' datasheets (GB/s), by the name torch reports. A lead,
# not a measurement: `kvprof bench` measures the device-to-device copy rate itself.
DATASHEET_BANDWIDTH_GBS = {
    "NVIDIA H200": 4800.0,
    "NVIDIA H100 80GB HBM3": 3350.0,
    "NVIDIA H100": 3350.0,
    "NVIDIA A100-SXM4-80GB": 2039.0,
    "NVIDIA A100-SXM4-40GB": 1555.0,
    "NVIDIA B200": 8000.0,
}


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
    return device


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
        "peak_bandwidth_gbs": DATASHEET_BANDWIDTH_GBS.get(p.name),
        "peak_bandwidth_source": "datasheet" if p.name in DATASHEET_BANDWIDTH_GBS else None,
    }
    return info


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
