"""Peak DRAM bandwidth: the spec table for the GPUs it lists (by any of their names), the
device's memory clock x bus width for any other, and the source named with the figure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvprof.core.devices import DEVICE_PROPERTIES, SPEC_TABLE, computed_peak_gbs, peak_from, spec_peak_gbs
from kvprof.kvcache.devinfo import _property_memory, device_properties, peak_bandwidth


@pytest.mark.parametrize(("name", "gbs"), [
    ("NVIDIA H200", 4800.0), ("NVIDIA H200 NVL", 4800.0),
    ("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100", 3350.0), ("NVIDIA H100-SXM5-80GB", 3350.0),
    ("NVIDIA H100 PCIe", 2000.0), ("NVIDIA H100 NVL", 3900.0),
    ("NVIDIA A100-SXM4-80GB", 2039.0), ("NVIDIA A100-SXM4-40GB", 1555.0), ("NVIDIA A100-PCIE-40GB", 1555.0),
    ("NVIDIA A100 80GB PCIe", 1935.0), ("NVIDIA L40S", 864.0), ("NVIDIA L4", 300.0), ("NVIDIA A10", 600.0),
    ("Tesla V100-SXM2-32GB", 900.0), ("Tesla T4", 320.0), ("nvidia h200", 4800.0),
])
def test_spec_table_by_name_variants(name: str, gbs: float) -> None:
    assert spec_peak_gbs(name) == gbs
    assert peak_from(name) is not None and peak_from(name).source == SPEC_TABLE  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "Some Future GPU", "", None, "AMD Instinct MI300X"])
def test_spec_table_does_not_guess(name: str | None) -> None:
    assert spec_peak_gbs(name) is None


def test_computed_from_clock_and_bus_width() -> None:
    # H100 SXM reports 2,619 MHz memory clock and a 5,120-bit bus: 3,352 GB/s (datasheet 3,350)
    assert computed_peak_gbs(2_619_000, 5120) == 3352.3
    assert computed_peak_gbs(0, 5120) is None and computed_peak_gbs(True, 8) is None
    assert computed_peak_gbs("2619000", 5120) is None
    p = peak_from("Some Future GPU", 1_000_000, 4096)
    assert p is not None and (p.gbs, p.source) == (1024.0, DEVICE_PROPERTIES)


def test_listed_device_takes_the_table_and_keeps_the_computed_figure_as_a_check() -> None:
    out = peak_bandwidth("NVIDIA H100 80GB HBM3", (2_619_000, 5120))
    assert (out["peak_bandwidth_gbs"], out["peak_bandwidth_source"]) == (3350.0, SPEC_TABLE)
    assert out["peak_bandwidth_computed_gbs"] == 3352.3 and out["peak_bandwidth_datasheet_gbs"] == 3350.0


def test_unknown_gpu_is_computed_from_its_properties() -> None:
    out = peak_bandwidth("Some Future GPU", (1_000_000, 4096))
    assert (out["peak_bandwidth_gbs"], out["peak_bandwidth_source"]) == (1024.0, DEVICE_PROPERTIES)
    assert out["peak_bandwidth_datasheet_gbs"] is None


def test_without_properties_the_table_or_nothing() -> None:
    assert peak_bandwidth("NVIDIA H200", None)["peak_bandwidth_source"] == SPEC_TABLE
    assert peak_bandwidth("NVIDIA H200", None)["peak_bandwidth_gbs"] == 4800.0
    unknown = peak_bandwidth("Other", (0, 0))
    assert unknown["peak_bandwidth_gbs"] is None and unknown["peak_bandwidth_source"] is None


def test_torch_properties_read_where_they_exist() -> None:
    """torch.cuda.get_device_properties' memory_clock_rate (kHz) and memory_bus_width (bits),
    read with getattr: an older torch without them, or a build reporting 0, gives None."""
    assert _property_memory(SimpleNamespace(memory_clock_rate=3_201_000, memory_bus_width=6144)) == (3_201_000, 6144)
    assert _property_memory(SimpleNamespace(name="x")) is None
    assert _property_memory(SimpleNamespace(memory_clock_rate=0, memory_bus_width=6144)) is None


def test_cpu_has_no_peak() -> None:
    import torch

    assert device_properties(torch.device("cpu"))["peak_bandwidth_gbs"] is None
