"""Every vintage of the Kineto format reads as today's: the same rows, kinds, correlations and writes.

Older torch.profiler traces (libkineto's ChromeTraceLogger of 2020-2021) name the same activities
``Kernel``, ``Runtime``, ``Operator``, ``Memcpy``, ``Memset``, bind launches to kernels with flows
of category ``async_gpu`` or ``async``, put GPU rows on tid ``"stream <n>"`` and may be a bare event
list. A trace in categories kvprof does not read at all is named as such, never "no GPU activity".
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvprof.analysis.generic import NO_GPU, generic_summary
from kvprof.trace.kineto import read_kineto
from kvprof.trace.load import load
from kvprof.trace.synthetic import (
    EngineReplaySpec,
    PhaseSpec,
    TraceSpec,
    Vintage,
    build,
    build_engine,
    dumps,
    vintage,
)
from kvprof.trace.table import to_frame

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "public"

vintages = st.builds(Vintage, categories=st.booleans(), flow_cat=st.sampled_from(["ac2g", "async_gpu", "async"]),
                     stream_tids=st.booleans(), bare_list=st.booleans())


def _write(tmp: Path, name: str, doc: object, gz: bool) -> Path:
    data = json.dumps(doc).encode()
    p = tmp / (name + (".json.gz" if gz else ".json"))
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def _rows(path: Path) -> tuple[dict[str, int], int, int]:
    ev = to_frame(read_kineto(path).events)
    kinds = {str(k): int(n) for k, n in ev["kind"].astype(str).value_counts().items()}
    gpu = ev[ev["device"] >= 0]
    return kinds, int((gpu["correlation"] >= 0).sum()), int(gpu["stream"].nunique())


@settings(max_examples=12, deadline=None, database=None, derandomize=True)
@given(v=vintages, graph=st.booleans(), layers=st.integers(1, 4), gz=st.booleans(), engine=st.booleans())
def test_a_vintage_reads_as_todays_trace(tmp_path_factory: pytest.TempPathFactory, v: Vintage, graph: bool,
                                         layers: int, gz: bool, engine: bool) -> None:
    tmp = tmp_path_factory.mktemp("vintage")
    if engine:
        doc, _ = build_engine(EngineReplaySpec(layers=list(range(layers))))
    else:
        doc, _ = build(TraceSpec(layers=list(range(layers)), phases=[PhaseSpec("decode", 4, 2, graph=graph)]))
    today = _write(tmp, "today", doc, gz)
    old = _write(tmp, "old", vintage(doc, v), gz)
    assert _rows(old) == _rows(today)
    if not v.bare_list:  # a bare list has no place for kvprof's metadata, nor for the plugin's
        a, b = load(today).traces[0], load(old).traces[0]
        assert b.attribution.get("writes") == a.attribution.get("writes")
        assert (to_frame(b.events)["write_id"] >= 0).sum() == (to_frame(a.events)["write_id"] >= 0).sum()


def test_legacy_categories_are_gpu_work(tmp_path: Path) -> None:
    """The regression: a 2021 trace (Kernel/Runtime) read as CPU-only, 'no GPU activity'."""
    doc, _ = build(TraceSpec(layers=[0, 1], phases=[PhaseSpec("decode", 4, 1, graph=False)]))
    p = tmp_path / "old.json"
    p.write_bytes(dumps(vintage(doc, Vintage(categories=True, flow_cat="async_gpu"))))
    t = read_kineto(p)
    gen = generic_summary(to_frame(t.events), t.stats)
    assert gen["gpu"] and gen["kernels_by_name"]


def test_unknown_categories_are_named_not_called_cpu_only(tmp_path: Path) -> None:
    """Another device's categories (an MTIA trace's, a future schema's): the note names them and the
    schema version, and says kvprof cannot read them; only a trace without such events is 'no GPU activity'."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
          *({"ph": "X", "cat": "mtia_runtime", "name": f"launch{i}", "pid": 1, "tid": 1, "ts": 20.0 + i, "dur": 1.0}
            for i in range(3))]
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"schemaVersion": 7, "traceEvents": ev}))
    t = read_kineto(p)
    note = generic_summary(to_frame(t.events), t.stats)["note"]
    assert "kvprof can read" in note and "'mtia_runtime' (3)" in note and "schemaVersion 7" in note
    p.write_text(json.dumps({"traceEvents": ev[:1]}))
    t = read_kineto(p)
    assert generic_summary(to_frame(t.events), t.stats)["note"] == NO_GPU


def test_public_2022_trace_of_legacy_categories() -> None:
    """HolisticTraceAnalysis' test trace in the old names (Kernel, Runtime, async_gpu flows): 4 kernels."""
    t = read_kineto(FIXTURES / "hta_inference_rank_1.json.gz")
    ev = to_frame(t.events)
    assert int((ev["kind"].astype(str) == "kernel").sum()) == 4
    assert int((ev["kind"].astype(str) == "runtime").sum()) == 8
    assert generic_summary(ev, t.stats)["gpu"]
