"""The committed H200 layout bench (traces/samples/h200-layouts) says what docs/layouts.md
quotes: kvprof's fused Triton writes meet the target at every point, beat the unfused
paths everywhere and are no slower than SGLang's MLA store. Read on CPU, no GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprof.bench.layouts import TOKENS, verdicts

SAMPLE = Path(__file__).resolve().parents[1] / "traces" / "samples" / "h200-layouts" / "bench.json"


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads(SAMPLE.read_text())


def test_sample_is_an_h200_graph_bench_over_the_whole_grid(result) -> None:
    assert "H200" in result["device"]["name"]
    graph = [r for r in result["records"] if r["mode"] == "graph"]
    for layout, fused in (("mla", "mla_triton"), ("paged", "paged_triton")):
        mine = [r for r in graph if r["layout"] == layout and r["variant"] == fused]
        assert sorted({r["tokens"] for r in mine}) == sorted(TOKENS)
        assert len(mine) == 2 * len(TOKENS) and all(r["status"] == "ok" for r in mine)


def test_fused_writes_meet_the_target_and_beat_unfused_and_sglang(result) -> None:
    lines = {line.split(":")[0]: line for line in verdicts(result)}
    assert "target met at 12/12 points" in lines["graph mla mla_triton"]
    assert "faster than mla_cat_copy at 12/12" in lines["graph mla mla_triton"]
    assert "vs sglang_mla: no slower at 12/12" in lines["graph mla mla_triton"]
    assert "target met at 12/12 points" in lines["graph paged paged_triton"]
    assert "faster than paged_unfused at 12/12" in lines["graph paged paged_triton"]


def test_every_graph_point_of_the_fused_writers_is_under_its_target(result) -> None:
    """The verdict lines above, recomputed from the raw medians and the run's copy rate."""
    rate = result["copy_rate_gbs"]
    for r in result["records"]:
        if r["mode"] == "graph" and r["variant"] in ("mla_triton", "paged_triton"):
            target = 1.2 + r["bytes"] / (0.9 * rate * 1e3)
            assert r["median_us"] <= target, (r["layout"], r["dtype"], r["tokens"], r["median_us"], target)
