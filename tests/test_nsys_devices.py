"""nsys exports of several GPUs: summarised per device (busy, overlap across the streams of ONE
device, kernels), the device's name read from the export's own tables in any of the schemas built
here; two GPUs busy at once are never 'overlap'."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvprof.analysis.generic import generic_summary
from kvprof.trace.load import load
from kvprof.trace.synthetic import NsysSpec, build_nsys
from kvprof.trace.table import to_frame

specs = st.builds(NsysSpec, devices=st.integers(1, 3), streams=st.integers(1, 3), kernels=st.integers(1, 4),
                  overlap_within=st.booleans(),
                  device_table=st.sampled_from(["TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU", None]),
                  name_column=st.sampled_from(["name", "deviceName", None]))


def _generic(path: Path) -> dict:
    t = load(path).traces[0]
    return generic_summary(to_frame(t.events), t.stats, {d["id"]: d["name"] for d in t.devices if d["name"]})


@settings(max_examples=15, deadline=None, database=None, derandomize=True)
@given(spec=specs)
def test_each_device_summarised_alone(tmp_path_factory: pytest.TempPathFactory, spec: NsysSpec) -> None:
    p = tmp_path_factory.mktemp("nsys") / "run.sqlite"
    expected = build_nsys(p, spec)
    g = _generic(p)
    got = [{k: d[k] for k in ("device", "kernels", "streams", "busy_ns", "overlap_ns", "name")} for d in g["devices"]]
    assert got == expected["devices"]
    assert g["overlap_ns"] == sum(d["overlap_ns"] for d in expected["devices"])


def test_two_gpus_busy_together_are_not_overlap(tmp_path: Path) -> None:
    """The regression: a 2-GPU export read 'overlap 99 %, 2 streams' (the GPUs running at once)."""
    p = tmp_path / "tp2.sqlite"
    build_nsys(p, NsysSpec(devices=2, streams=1, kernels=8))
    g = _generic(p)
    assert g["overlap_ns"] == 0 and g["overlap_frac"] == 0
    assert [d["name"] for d in g["devices"]] == ["NVIDIA H100 80GB HBM3"] * 2


def test_analyze_names_the_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from kvprof.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    p = tmp_path / "tp2.sqlite"
    build_nsys(p, NsysSpec(devices=2, streams=2, kernels=3, device_table="TARGET_INFO_GPU"))
    assert main(["analyze", str(p)]) in (0, None)
    text = " ".join(capsys.readouterr().out.split())
    assert "device: NVIDIA H100 80GB HBM3" in text
    assert "device 0 (NVIDIA H100 80GB HBM3): busy" in text and "device 1 (NVIDIA H100 80GB HBM3)" in text


def test_stream_lanes_one_per_device_and_stream() -> None:
    """Stream 7 of GPU 0 and stream 7 of GPU 1 are two lanes; the same pair is one lane wherever it recurs."""
    import pandas as pd

    from kvprof.analysis.gpu_groups import stream_lanes

    lanes = stream_lanes(pd.DataFrame({"device": [0, 0, 1, 1, 0, -1], "stream": [7, 8, 7, 8, 7, -1]}))
    assert lanes.tolist() == [0, 1, 2, 3, 0, 4]
