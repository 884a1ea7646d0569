"""An engine's CUDA-graph replays tied to writes through the SGLang plugin's graph record.

Two halves, CPU only: the plugin's hook on torch.cuda.CUDAGraph (a stand-in class with the
methods' names: what it records per captured graph, the range around each replay, and that it
leaves a torch without the hook point alone), and the trace reader given a synthetic Kineto
trace of an engine's replays (kvprof.trace.synthetic.build_engine) with the sidecar that
describes its graphs. tests/test_sglang_plugin.py runs the hook inside SGLang's package.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvprof.cli import main
from kvprof.core.sidecar import SIDECAR_SCHEMA, CapturedGraph, GraphWrite, Sidecar, SidecarPool, encode_sidecar
from kvprof.integrations import sglang as plugin_mod
from kvprof.trace.load import load
from kvprof.trace.synthetic import EngineReplaySpec, build_engine, dumps


class FakeGraph:
    """torch.cuda.CUDAGraph's capture and replay methods, without CUDA."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self.events.append("begin")

    def capture_end(self) -> None:
        self.events.append("end")

    def replay(self) -> None:
        self.events.append("replay")


@pytest.fixture
def graphs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> type[FakeGraph]:
    """A fresh plugin state and graph record, the hook placed on a fresh stand-in class."""
    monkeypatch.setenv("KVPROF_SGLANG_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_mod, "STATE", plugin_mod._State())
    monkeypatch.setattr(plugin_mod, "GRAPHS", plugin_mod._Graphs())
    monkeypatch.setattr(plugin_mod, "_ranks", lambda: (0, 0, 1))
    cls = type("CUDAGraph", (FakeGraph,), {})
    where = plugin_mod.hook_graphs(cls)
    assert where.endswith("CUDAGraph.{capture_begin,capture_end,replay}")
    assert plugin_mod.hook_graphs(cls) == where  # placed once
    plugin_mod.GRAPHS.hook = where
    return cls


def _write(variant: str, layer: int, tokens: int, native: str = "store_cache") -> None:
    """What a hooked write does around SGLang's own write: names it, then counts its path."""
    plugin_mod._LOCAL.write = (variant, layer, tokens, *plugin_mod._native_kernel(native))
    plugin_mod.STATE.count(f"sglang:{variant}", "set_kv_buffer")
    plugin_mod._LOCAL.write = None


def test_capture_records_the_writes_in_order_and_replays_carry_a_range(graphs: type[FakeGraph], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    plugin_mod.STATE.pools[1] = {"class": "MHATokenToKVPool", "variant": "sglang_mha", "native_path": "store_cache"}
    _write("sglang_mha", 0, 3)  # eager: in no graph
    empty, g = graphs(), graphs()
    empty.capture_begin()
    empty.capture_end()  # a graph without writes: counted, not listed
    g.capture_begin(pool=None)
    for layer in (0, 1, 2):
        _write("sglang_mha", layer, 16)
    g.capture_end()
    _write("sglang_mha", 1, 3)  # eager again
    assert g.events == ["begin", "end"]
    (rec,) = plugin_mod.GRAPHS.graphs
    assert rec.graph == 1 and [(w.layer, w.tokens, w.kernel, w.kernels) for w in rec.writes] == [
        (0, 16, "store_kvcache_kernel", 1), (1, 16, "store_kvcache_kernel", 1), (2, 16, "store_kvcache_kernel", 1)]
    assert plugin_mod.GRAPHS.empty == 1

    ranged: list[str] = []
    monkeypatch.setattr(plugin_mod._ReplayRanges, "run",
                        lambda self, name, fn, *a, **k: ranged.append(name) or fn(*a, **k))
    g.replay()
    empty.replay()
    assert ranged == ["kvprof.graph_replay[1]"] and g.events[-1] == "replay" and empty.events[-1] == "replay"

    (path,) = tmp_path.glob("kvprof-sglang.TP-0.pid-*.json")  # rewritten when the capture ended
    doc = json.loads(path.read_text())
    assert doc["graphs"][0]["writes"][2] == {"layer": 2, "variant": "sglang_mha", "path": "sglang:sglang_mha",
                                             "tokens": 16, "kernel": "store_kvcache_kernel", "kernels": 1}
    assert doc["graphs_without_writes"] == 1 and doc["graph_hook"].endswith("replay}")


def test_a_failed_capture_leaves_no_open_record(graphs: type[FakeGraph]) -> None:
    class Failing(graphs):  # type: ignore[misc, valid-type]
        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
            raise RuntimeError("capture refused")

    plugin_mod.hook_graphs(Failing)
    with pytest.raises(RuntimeError):
        Failing().capture_begin()
    assert not getattr(plugin_mod.GRAPHS.local, "stack", [])


@pytest.mark.parametrize("cuda", [SimpleNamespace(), SimpleNamespace(CUDAGraph=type("CUDAGraph", (), {}))])
def test_no_hook_point_leaves_torch_alone(cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without CUDAGraph or without its capture methods: a reason, nothing patched."""
    monkeypatch.setattr(torch, "cuda", cuda)
    why = plugin_mod.hook_graphs()
    assert why.startswith("not hooked: ")
    cls = getattr(cuda, "CUDAGraph", None)
    assert cls is None or not hasattr(cls, "capture_begin")


def _engine_run(tmp_path: Path, spec: EngineReplaySpec, kernel: str | None = "store_kvcache_kernel",
                pid: int | None = None) -> Path:
    run = tmp_path / "prof"
    run.mkdir()
    doc, _ = build_engine(spec)
    (run / "1796307500-TP-0.trace.json").write_bytes(dumps(doc))
    recorded = [CapturedGraph(graph=g, writes=[GraphWrite(layer=layer, variant="sglang_mha", path="sglang:sglang_mha",
                                                          tokens=bs, kernel=kernel) for layer in spec.layers])
                for g, bs in spec.graphs.items()]
    side = Sidecar(schema=SIDECAR_SCHEMA, pid=spec.pid if pid is None else pid, tp_rank=0,
                   pools=[SidecarPool(cls="MHATokenToKVPool", variant="sglang_mha", native_path="store_cache")],
                   paths={"sglang:sglang_mha": len(spec.layers) * len(spec.graphs)}, graphs=recorded)
    (run / "kvprof-sglang.TP-0.pid-1584.json").write_bytes(encode_sidecar(side))
    return run


def test_replays_attributed_by_the_recorded_order(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    spec = EngineReplaySpec()
    run = _engine_run(tmp_path, spec)
    (t,) = load(run).traces
    assert t.attribution["graph_replays_by_plugin_record"] == 3 and t.attribution["methods"] == {"graph_order": 12}
    w = t.writes
    expected_writes = [(layer, spec.graphs[g]) for g in spec.replays for layer in spec.layers]
    assert list(zip(w["layer"], w["tokens"])) == expected_writes
    assert set(w["variant"]) == {"sglang_mha"} and set(w["attribution"]) == {"graph_order"}
    ev = t.events.to_pandas()
    tied = ev[ev["write_id"] >= 0]
    assert len(tied) == 12 and tied["name"].astype(str).str.contains("store_kvcache_kernel").all()
    _, expected = build_engine(spec)
    assert sorted(tied["start_ns"] - tied["start_ns"].min()) == sorted(
        x["start_ns"] - expected["writes"][0]["start_ns"] for x in expected["writes"])
    assert not any("graph replays lie outside" in m for m in t.warnings)

    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "out"
    assert main(["analyze", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sglang_mha: fused · paths say fused (fused x8, from the SGLang plugin) · GPU ops/write 1 x12" in printed
    (row,) = json.loads((out / "summary.json").read_text())["write_kernels"]["stepless_writes"]
    assert (row["writes"], row["graph_writes"], row["layers"], row["kernels_per_write"]) == (12, 12, 4, 1)
    assert row["gpu_span_ns"] == pytest.approx(spec.write_ns, abs=2)


def test_without_replay_ranges_the_kernels_pick_the_graph(tmp_path: Path) -> None:
    """No kvprof.graph_replay range (a profiler that did not record them): two graphs fit with the
    same layers, so the writes are tied, their token counts unknown, and a warning says so."""
    spec = EngineReplaySpec(replay_ranges=False)
    (t,) = load(_engine_run(tmp_path, spec)).traces
    assert len(t.writes) == 12 and set(t.writes["tokens"]) == {-1}
    assert any("other token counts" in m for m in t.warnings)


def test_a_replay_that_does_not_follow_the_record_is_left_with_a_warning(tmp_path: Path) -> None:
    spec = EngineReplaySpec(drop={1: [2]})  # replay 1 ran 3 write kernels, graph 1 recorded 4
    (t,) = load(_engine_run(tmp_path, spec)).traces
    assert t.attribution["graph_replays_by_plugin_record"] == 2 and len(t.writes) == 8
    assert set(t.writes["graph_launch"]) == {5001, 5003}
    (warning,) = [m for m in t.warnings if "store_kvcache_kernel" in m]
    assert "3 kernels named store_kvcache_kernel, where graph 1 recorded 4 writes of 4 kernels" in warning
    assert "counted by name only" in warning
    assert any("1 graph replays lie outside kvprof step ranges" in m for m in t.warnings)


def test_writes_without_a_kernel_name_are_counted_by_name_only(tmp_path: Path) -> None:
    (t,) = load(_engine_run(tmp_path, EngineReplaySpec(), kernel=None)).traces
    assert not len(t.writes)
    assert any("recorded graph 0's writes of sglang_mha without a kernel name" in m for m in t.warnings)


def test_the_sidecar_of_another_process_is_not_used(tmp_path: Path) -> None:
    side = Sidecar(schema=SIDECAR_SCHEMA, pid=1, graphs=[CapturedGraph(graph=0, writes=[])])
    other = Sidecar(schema=SIDECAR_SCHEMA, pid=2, graphs=[CapturedGraph(graph=0, writes=[])])
    spec = EngineReplaySpec()
    run = _engine_run(tmp_path, spec, pid=99)
    (run / "kvprof-sglang.TP-1.pid-1.json").write_bytes(encode_sidecar(side))
    (run / "kvprof-sglang.TP-2.pid-2.json").write_bytes(encode_sidecar(other))
    (t,) = load(run).traces
    assert not len(t.writes) and any("no SGLang plugin sidecar of its process" in m for m in t.warnings)
