"""A GPU's peak DRAM bandwidth, and where the figure came from. Torch-free.

Three sources, in the order a run prefers them:

- ``SPEC_TABLE``: NVIDIA's datasheet figure for the devices listed in ``SPEC_BANDWIDTH``,
  looked up by the name the device reports (torch's ``get_device_name``, Kineto's
  ``deviceProperties``, nsys' ``TARGET_INFO_GPU``), written several ways;
- ``DEVICE_PROPERTIES``: for any other CUDA device, 2 transfers per memory clock x the bus
  width, from the properties torch or the CUDA driver report (``computed_peak_gbs``);
- what a source recorded with its figure (``peak_bandwidth_source``), e.g. Nsight Systems'
  ``memoryBandwidth`` (``NSYS_DEVICE_INFO``).

None of them is a measurement: ``kvprof bench`` measures the device-to-device copy rate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SPEC_TABLE = "spec table"
DEVICE_PROPERTIES = "device properties"
NSYS_DEVICE_INFO = "Nsight Systems device info"
CAPTURE_METADATA = "capture metadata"  # a recorded figure whose run did not say where it came from


@dataclass(frozen=True)
class SpecEntry:
    """One row of the spec table: the name tokens that pick it, the figure, the model it is."""

    tokens: frozenset[str]
    gbs: float
    model: str


def _entry(tokens: str, gbs: float, model: str) -> SpecEntry:
    return SpecEntry(frozenset(tokens.split()), gbs, model)


# Peak DRAM bandwidth per GPU, GB/s, from NVIDIA's public datasheets. First match wins: an
# entry's tokens must all be in the device's name (split at spaces, dashes and underscores,
# upper case; "NVIDIA" and "Tesla" dropped), so the more specific rows come first.
SPEC_BANDWIDTH: tuple[SpecEntry, ...] = (
    _entry("B200", 8000.0, "B200"),
    _entry("H200", 4800.0, "H200 (SXM and NVL, 141 GB HBM3e)"),
    _entry("H100 NVL", 3900.0, "H100 NVL (94 GB HBM3)"),
    _entry("H100 PCIE", 2000.0, "H100 PCIe (80 GB HBM2e)"),
    _entry("H800 PCIE", 2000.0, "H800 PCIe (80 GB HBM2e)"),
    _entry("H100", 3350.0, "H100 SXM (80 GB HBM3)"),
    _entry("H800", 3350.0, "H800 SXM (80 GB HBM3)"),
    _entry("A100 80GB PCIE", 1935.0, "A100 80GB PCIe"),
    _entry("A100 80GB", 2039.0, "A100 80GB SXM"),
    _entry("A100", 1555.0, "A100 40GB (SXM and PCIe)"),
    _entry("A800 80GB", 2039.0, "A800 80GB SXM"),
    _entry("L40S", 864.0, "L40S"),
    _entry("L40", 864.0, "L40"),
    _entry("L4", 300.0, "L4"),
    _entry("A40", 696.0, "A40"),
    _entry("A10", 600.0, "A10"),
    _entry("V100", 900.0, "V100 (SXM2 and PCIe)"),
    _entry("T4", 320.0, "T4"),
)
_DROPPED = frozenset({"NVIDIA", "TESLA"})


def name_tokens(name: str) -> frozenset[str]:
    """A device name as the spec table reads it: "NVIDIA A100-SXM4-80GB" -> {A100, SXM4, 80GB}."""
    return frozenset(t for t in re.split(r"[\s\-_]+", name.upper()) if t and t not in _DROPPED)


def spec_entry(name: str | None) -> SpecEntry | None:
    """The spec table's row for a device name, or None for a device it does not list."""
    if not isinstance(name, str) or not name.strip():
        return None
    tokens = name_tokens(name)
    return next((e for e in SPEC_BANDWIDTH if e.tokens <= tokens), None)


def spec_peak_gbs(name: str | None) -> float | None:
    """The datasheet's peak DRAM bandwidth of a device by name (GB/s), or None."""
    e = spec_entry(name)
    return e.gbs if e is not None else None


def computed_peak_gbs(memory_clock_khz: object, bus_width_bits: object) -> float | None:
    """2 x memory clock x bus width / 8, GB/s (one decimal), or None unless both are positive integers."""
    if not (isinstance(memory_clock_khz, int) and isinstance(bus_width_bits, int)) \
            or isinstance(memory_clock_khz, bool) or isinstance(bus_width_bits, bool):
        return None
    if memory_clock_khz <= 0 or bus_width_bits <= 0:
        return None
    return round(2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9, 1)


@dataclass(frozen=True)
class Peak:
    """A peak bandwidth and the words for where it came from."""

    gbs: float
    source: str


def peak_from(name: str | None, memory_clock_khz: object = None, bus_width_bits: object = None) -> Peak | None:
    """The spec table's figure for a listed device, else the one computed from its memory
    clock and bus width, else None."""
    spec = spec_peak_gbs(name)
    if spec is not None:
        return Peak(spec, SPEC_TABLE)
    computed = computed_peak_gbs(memory_clock_khz, bus_width_bits)
    return Peak(computed, DEVICE_PROPERTIES) if computed is not None else None
