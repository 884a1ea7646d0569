"""Peak DRAM bandwidth from the device's own attributes, the datasheet only as a check."""

from __future__ import annotations

from kvprof.devinfo import DATASHEET_BANDWIDTH_GBS, device_properties, peak_bandwidth


def test_peak_from_clock_and_bus_width() -> None:
    # H100 SXM reports 2,619 MHz memory clock and a 5,120-bit bus: 3,352 GB/s (datasheet 3,350)
    out = peak_bandwidth("NVIDIA H100 80GB HBM3", (2_619_000, 5120))
    assert out["peak_bandwidth_gbs"] == 3352.3
    assert out["peak_bandwidth_datasheet_gbs"] == DATASHEET_BANDWIDTH_GBS["NVIDIA H100 80GB HBM3"]
    assert out["peak_bandwidth_source"].startswith("device attributes")
    assert abs(out["peak_bandwidth_gbs"] / out["peak_bandwidth_datasheet_gbs"] - 1) < 0.01


def test_unknown_gpu_still_gets_a_peak() -> None:
    out = peak_bandwidth("Some Future GPU", (1_000_000, 4096))
    assert out["peak_bandwidth_gbs"] == 1024.0 and out["peak_bandwidth_datasheet_gbs"] is None


def test_without_attributes_the_datasheet_or_nothing() -> None:
    assert peak_bandwidth("NVIDIA H200", None)["peak_bandwidth_source"] == "datasheet"
    assert peak_bandwidth("NVIDIA H200", None)["peak_bandwidth_gbs"] == 4800.0
    unknown = peak_bandwidth("Other", (0, 0))
    assert unknown["peak_bandwidth_gbs"] is None and unknown["peak_bandwidth_source"] is None


def test_cpu_has_no_peak() -> None:
    import torch

    assert device_properties(torch.device("cpu"))["peak_bandwidth_gbs"] is None
