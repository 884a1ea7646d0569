"""Engine traces that other people's profilers wrote (traces/public, TraceLens' test data: SGLang and
vLLM on an MI300X, each one decode step replayed from a HIP graph): every KV-write kernel found by
name, tied to its step and layer by the engine's own step range, and tied to its graph replay; and
the forwards of a trace without step ranges found from its writes' gaps when a prefill's per-layer
gaps are as long as the gaps between decodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvprof.analysis.engine_steps import ENGINE_STEP_RANGES, _by_period
from kvprof.analysis.write_kernels import BUILTIN_PATTERNS, write_kernel_summary
from kvprof.core.schema import GRAPH_LAUNCH_NAMES
from kvprof.trace.load import load

PUBLIC = Path(__file__).resolve().parents[1] / "traces" / "public"
METHODS = {name.split(" (")[0]: name for name, _ in ENGINE_STEP_RANGES}

# file -> (write family, write kernels = layers, step method, kernels the graph replay launched)
CASES = {
    "tracelens_sglang_qwen3_8b_decode_mi300x.json.gz": ("sglang_store_cache", 36, "SGLang step ranges", 544),
    "tracelens_vllm_decode_full_graph_mi300x.json.gz": ("vllm_reshape_and_cache", 24, "vLLM execute ranges", 421),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_public_engine_trace_writes_tied_to_step_layer_and_replay(name: str) -> None:
    family, layers, method, replayed = CASES[name]
    (t,) = write_kernel_summary(load(PUBLIC / name))["traces"]
    assert [f["family"] for f in t["families"]] == [family]
    assert t["write_kernels"] == layers
    assert t["step_method"] == METHODS[method] and t["no_steps_reason"] is None
    assert t["steps_count"] == 1 and t["tied_step_and_layer"] == layers and t["unassigned"] == []
    assert t["step_layer"]["layers"] == list(range(layers))
    # one hipGraphLaunch replays the decode step, its KV writes included
    g = t["graph"]
    assert (g["launches"], g["replayed_kernels"], g["replayed_write_kernels"], g["replays_with_writes"]) == (
        1, replayed, layers, 1)
    assert g["outside_kvprof_steps"]["untied"] == 0


@pytest.mark.parametrize("kernel", [
    "void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)",
    "void store_kvcache_kernel<256l, 256l, 128, true, int>(StoreKVCacheParams)",
])
def test_sglang_jit_store_kernel_matches_before_and_after_its_rename(kernel: str) -> None:
    import regex

    first = next(p for p in BUILTIN_PATTERNS if regex.search(p.regex, kernel))
    assert first.name == "sglang_store_cache"


def test_hip_graph_launches_are_graph_launches() -> None:
    assert {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"} <= set(GRAPH_LAUNCH_NAMES)


@pytest.mark.parametrize("label", [
    "execute_context_1(888_788544)_generation_0(0)",
    "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)",
])
def test_vllm_execute_range_is_a_step_range(label: str) -> None:
    hits = [name for name, rx in ENGINE_STEP_RANGES if rx.match(label)]
    assert hits == [METHODS["vLLM execute ranges"]]


@pytest.mark.parametrize("label", ["execute_model", "execute_context", "## Call CompiledFxGraph abc ##",
                                   "capture_32_FULL"])
def test_other_host_ranges_are_not_step_ranges(label: str) -> None:
    assert not [name for name, rx in ENGINE_STEP_RANGES if rx.match(label)]


def _writes(gaps_us: list[float], dur_us: float = 2.0) -> pd.DataFrame:
    """Write kernels one after another, ``gaps_us[i]`` between the end of one and the next's start."""
    starts, t = [], 0.0
    for g in [0.0, *gaps_us]:
        t += g
        starts.append(t)
        t += dur_us
    return pd.DataFrame({"start_ns": (np.asarray(starts) * 1000).astype(np.int64),
                         "dur_ns": np.full(len(starts), int(dur_us * 1000), np.int64)})


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(3, 12), decodes=st.integers(3, 6), prefill_gap=st.floats(1300, 3000),
       decode_gap=st.floats(50, 250), between=st.floats(3100, 40000))
def test_prefill_with_long_layer_gaps_and_decodes_part_into_forwards(layers: int, decodes: int, prefill_gap: float,
                                                                      decode_gap: float, between: float) -> None:
    # a prefill whose per-layer gaps exceed 5x the decodes' (most gaps: the median), then decodes: one
    # forward each; the gap threshold alone cuts the prefill into single writes
    gaps = [prefill_gap] * (layers - 1)
    for _ in range(decodes):
        gaps += [between] + [decode_gap] * (layers - 1)
    w = _writes(gaps)
    out = _by_period(w, np.ones(len(w), dtype=bool))
    assert not isinstance(out, str), out
    steps, key = out
    assert len(steps) == decodes + 1
    assert key.tolist() == [i // layers for i in range(len(w))]


def test_gaps_without_forwards_of_one_size_are_named_not_guessed() -> None:
    # groups of 3, 5 and 4 writes between long gaps, short gaps inside: no cut gives groups of one size
    w = _writes([100, 100, 5000, 100, 100, 100, 100, 7000, 100, 100, 100])
    out = _by_period(w, np.ones(len(w), dtype=bool))
    assert isinstance(out, str) and "no periodic structure" in out
