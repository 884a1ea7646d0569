"""Hostile SGLang plugin sidecars: what the reader refuses, how kernels are matched, what reaches
the terminal. Each case is one ``kvprof analyze`` of a synthetic engine trace beside a sidecar;
every refusal is one line with exit 3 (a sidecar is read like a trace), never a traceback."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kvprof.cli import main
from kvprof.core.sidecar import (
    MAX_NAME,
    SIDECAR_SCHEMA,
    CapturedGraph,
    GraphWrite,
    Sidecar,
    SidecarDevice,
    SidecarPool,
    encode_sidecar,
    kernel_matches,
)
from kvprof.trace.load import load
from kvprof.trace.synthetic import ENGINE_GEMM, EngineReplaySpec, build_engine, dumps

# what a terminal would act on: C0 but newline, DEL, C1, bidi and line-separator marks
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _graphs(spec: EngineReplaySpec, kernel: str = "store_kvcache_kernel", variant: str = "sglang_mha") -> list[dict]:
    return [{"graph": g, "writes": [{"layer": layer, "variant": variant, "path": f"sglang:{variant}", "tokens": bs,
                                     "kernel": kernel, "kernels": 1} for layer in spec.layers]}
            for g, bs in spec.graphs.items()]


def _doc(spec: EngineReplaySpec, **keys: object) -> dict:
    doc: dict = {"schema": SIDECAR_SCHEMA, "pid": spec.pid, "tp_rank": 0,
                 "pools": [{"class": "MHATokenToKVPool", "variant": "sglang_mha", "native_path": "store_cache"}],
                 "paths": {"sglang:sglang_mha": 12}, "graphs": _graphs(spec)}
    doc.update(keys)
    return doc


def _run(tmp_path: Path, sidecar: dict | bytes, spec: EngineReplaySpec | None = None,
         name: str = "kvprof-sglang.TP-0.pid-1584.json") -> Path:
    spec = spec or EngineReplaySpec()
    run = tmp_path / "prof"
    run.mkdir(exist_ok=True)
    doc, _ = build_engine(spec)
    (run / "1796307500-TP-0.trace.json").write_bytes(dumps(doc))
    raw = sidecar if isinstance(sidecar, bytes) else json.dumps(sidecar).encode()
    (run / name).write_bytes(raw)
    return run


def _refused(run: Path, capsys: pytest.CaptureFixture[str], *words: str) -> str:
    t0 = time.monotonic()
    rc = main(["analyze", str(run), "--out", str(run.parent / "out")])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert time.monotonic() - t0 < 20
    (line,) = err.strip().splitlines()
    assert line.startswith("kvprof analyze: error: ") and "Traceback" not in err
    for w in words:
        assert w in line, line
    assert not (run.parent / "out").exists()
    return line


def _write(spec: EngineReplaySpec, **change: object) -> list[dict]:
    graphs = _graphs(spec)
    graphs[0]["writes"][1].update(change)
    return graphs


BIG = 1 << 64  # past uint64
CASES = {
    "negative tokens": lambda s: _doc(s, graphs=_write(s, tokens=-5)),
    "layer below -1": lambda s: _doc(s, graphs=_write(s, layer=-2)),
    "negative layer count": lambda s: _doc(s, pools=[{"class": "X", "variant": "v", "layer_num": -3}]),
    "zero kernels per write": lambda s: _doc(s, graphs=_write(s, kernels=0)),
    "tokens past 2^64": lambda s: _doc(s, graphs=_write(s, tokens=BIG)),
    "layer past 2^64": lambda s: _doc(s, graphs=_write(s, layer=BIG * BIG)),
    "graph id past 2^64": lambda s: _doc(s, graphs=[{"graph": BIG, "writes": []}]),
    "negative graph id": lambda s: _doc(s, graphs=[{"graph": -1, "writes": []}]),
    "pid past 2^64": lambda s: _doc(s, pid=BIG),
    "negative pid": lambda s: _doc(s, pid=-1584),
    "count past 2^64": lambda s: _doc(s, paths={"sglang:sglang_mha": BIG}),
    "count past 2^53": lambda s: _doc(s, paths={"sglang:sglang_mha": (1 << 53) + 1}),
    "negative count": lambda s: _doc(s, paths={"sglang:sglang_mha": -1}),
    "graphs without writes past 2^64": lambda s: _doc(s, graphs_without_writes=BIG),
    "device memory past 2^64": lambda s: _doc(s, device={"total_memory_bytes": BIG}),
    "more fallbacks than paths": lambda s: _doc(s, writer="triton_fused", paths={"sglang:fallback": 2},
                                                fallbacks={"no loc": 2, "dtype": 1}),
    "fallbacks without a fallback count": lambda s: _doc(s, writer="triton_fused", fallbacks={"no loc": 1}),
    "variant of 200k characters": lambda s: _doc(s, graphs=_write(s, variant="v" * 200_000)),
    "path key of 200k characters": lambda s: _doc(s, paths={"sglang:" + "v" * 200_000: 1}),
    "kernel with a space": lambda s: _doc(s, graphs=_write(s, kernel="store kvcache")),
    "kernel with template arguments": lambda s: _doc(s, graphs=_write(s, kernel="store_kvcache_kernel<256>")),
    "empty kernel": lambda s: _doc(s, graphs=_write(s, kernel="")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_sidecar_is_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(_run(tmp_path, CASES[case](EngineReplaySpec())), capsys, "kvprof-sglang.TP-0.pid-1584.json")


@pytest.mark.parametrize("where", ["unknown key", "pools", "graphs", "writes"])
def test_a_sidecar_nested_100k_deep_is_one_line(where: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    head = json.dumps(_doc(EngineReplaySpec()))[:-1]
    raw = {"unknown key": head + ', "extra": ' + deep + "}",
           "pools": head.replace('"pools": [', '"pools": [' + deep + ", ", 1) + "}",
           "graphs": head + ', "graphs": [' + deep + "]}",
           "writes": head + ', "graphs": [{"graph": 0, "writes": ' + deep + "}]}"}[where]
    _refused(_run(tmp_path, raw.encode()), capsys, "sidecar")


def test_two_sidecars_of_one_process_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = EngineReplaySpec()
    run = _run(tmp_path, _doc(spec))
    other = _doc(spec, graphs=_graphs(spec, variant="other"))
    (run / "kvprof-sglang.TP-1.pid-1584.json").write_text(json.dumps(other))
    line = _refused(run, capsys, "process 1584", "kvprof-sglang.TP-0.pid-1584.json", "kvprof-sglang.TP-1.pid-1584.json")
    assert "two kvprof engine sidecars" in line


def test_the_sidecars_kernel_is_a_whole_name_not_a_substring_of_a_gemm(tmp_path: Path) -> None:
    """A sidecar naming part of the GEMM's name ties nothing to it: before, every GEMM of each
    replay was taken for a write (4 per replay, as many as the record's writes)."""
    spec = EngineReplaySpec()
    part = ENGINE_GEMM.split("_")[1]  # "hsh": a substring of nvjet_hsh_128x64...
    (t,) = load(_run(tmp_path, _doc(spec, graphs=_graphs(spec, kernel=part)))).traces
    assert not len(t.writes)
    ev = t.events.to_pandas()
    assert not ev[ev["name"] == ENGINE_GEMM]["write_id"].ge(0).any()


@pytest.mark.parametrize(("name", "recorded", "expected"), [
    ("void sglang::store_kvcache_kernel<256l, 256l, 32u, true, long>(sglang::StoreKVCacheParams)",
     {"store_kvcache_kernel", "sglang::store_kvcache_kernel"},
     {"store_kvcache_kernel", "sglang::store_kvcache_kernel"}),
    ("_store_kv_kernel", {"_store_kv_kernel"}, {"_store_kv_kernel"}),
    ("_store_kv_kernel_0d1d2d3de", {"_store_kv_kernel"}, {"_store_kv_kernel"}),  # Triton's specialisation suffix
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::"
     "index_put_kernel_impl<at::native::OpaqueType<2> > >(...)", {"index_put"}, {"index_put"}),
    (ENGINE_GEMM, {"hsh", "nvjet", "128x64", "h", "NTN", "coopA"}, {"nvjet"}),  # a prefix, then "_": the rule
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", {"gemm", "xmma", "bf16"}, set()),
    ("xstore_kvcache_kernel", {"store_kvcache_kernel"}, set()),
    ("store_kvcache_kernelx", {"store_kvcache_kernel"}, set()),
    ("other::store_kvcache_kernel", {"sglang::store_kvcache_kernel"}, set()),
])
def test_kernel_matches_by_whole_identifiers(name: str, recorded: set[str], expected: set[str]) -> None:
    assert kernel_matches(name, recorded) == expected


def test_kernel_matching_is_linear_in_the_name() -> None:
    recorded = {"store_kvcache_kernel", "a_" * (MAX_NAME // 2 - 1) + "a", "x::y::z"}
    t0 = time.monotonic()
    for name in ("a_" * 300_000, "a::" * 200_000 + "b", " ".join(["a_" * 600] * 300), "_" * 500_000):
        kernel_matches(name, recorded)
    assert time.monotonic() - t0 < 10  # each of these took minutes with a slice per "_"


def test_names_from_a_sidecar_reach_the_terminal_inert(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """ESC, BEL, CR and a bidi override in every name of a sidecar: analyze prints them as their
    escapes (the plugin's table printed the writer and its paths raw)."""
    monkeypatch.setenv("COLUMNS", "400")
    v = "ev\x1b]0;pwn\x07\x1b[31mil\r\u202e[link=http://x]y[/link]"
    spec = EngineReplaySpec()
    side = Sidecar(schema=SIDECAR_SCHEMA, pid=spec.pid, tp_rank=0, writer=v, writer_error=v,
                   pools=[SidecarPool(cls=v, variant=v, native_path=v, route_reason=v)],
                   paths={f"sglang:{v}": 5, f"writer:{v}:{v}": 3, "sglang:fallback": 2}, fallbacks={v: 2},
                   graphs=[CapturedGraph(graph=g, writes=[GraphWrite(layer=layer, variant=v, path=f"sglang:{v}",
                                                                     tokens=8, kernel="store_kvcache_kernel")
                                                          for layer in spec.layers]) for g in spec.graphs],
                   device=SidecarDevice(name=v))
    run = _run(tmp_path, encode_sidecar(side), spec)
    assert main(["analyze", str(run), "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert not UNSAFE.findall(out + err)
    assert "\\x1b]0;pwn\\x07" in out and "\\u202e" in out
    assert "[link=http://x]" in out  # shown, not turned into a link


def test_a_replay_range_with_a_graph_number_past_int64_is_no_graph(tmp_path: Path) -> None:
    spec = EngineReplaySpec(replays=[0])
    run = _run(tmp_path, _doc(spec), spec)
    trace = run / "1796307500-TP-0.trace.json"
    trace.write_text(trace.read_text().replace("kvprof.graph_replay[0]", "kvprof.graph_replay[" + "9" * 40 + "]"))
    (t,) = load(run).traces
    assert len(t.writes) == 4  # no range it can use: the kernels pick the graph (0 fits, 1 does not)
