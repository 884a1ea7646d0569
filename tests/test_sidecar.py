"""The SGLang plugin's sidecar as a typed core object, and what analyze makes of it: the
verdict from the paths the plugin counted (console, summary.json, the dashboard's and the
HTML report's verdict frame), the device's peak with its source. CPU only: synthetic
sidecars and traces, and the committed H200 samples (traces/samples/h200-sglang)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvprof.api as kv
from kvprof.cli import main
from kvprof.core.errors import TraceError
from kvprof.core.sidecar import (
    PLUGIN_SOURCE,
    SIDECAR_SCHEMA,
    Sidecar,
    SidecarDevice,
    SidecarPool,
    decode_sidecar,
    encode_sidecar,
    plugin_paths,
    read_sidecar,
)
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

SAMPLE = Path(__file__).resolve().parents[1] / "traces" / "samples" / "h200-sglang"


def _folder(tmp_path: Path, sidecar: dict | bytes, variant: str = "sglang_mha", kernel: str = "store_kvcache_kernel",
            kernels: int = 1, device_name: str | None = "NVIDIA H200") -> Path:
    """An SGLang-style folder: one Kineto trace whose writes carry the plugin's ranges (no kvprof
    metadata, as SGLang's profiler writes it) and the sidecar."""
    run = tmp_path / "prof"
    run.mkdir(parents=True)
    spec = TraceSpec(variant=variant, phases=[PhaseSpec("decode", 8, 2)],
                     write=WriteSpec([KernelSpec(7, i * 1200, 1000, name=kernel) for i in range(kernels)]))
    doc, _ = build(spec)
    del doc["kvprof"]  # SGLang's own trace: no kvprof capture metadata
    if device_name is None:
        del doc["deviceProperties"]
    else:
        doc["deviceProperties"][0]["name"] = device_name
    (run / "1790857026.5-TP-0.trace.json").write_bytes(dumps(doc))
    raw = sidecar if isinstance(sidecar, bytes) else json.dumps(sidecar).encode()
    (run / "kvprof-sglang.TP-0.pid-450.json").write_bytes(raw)
    return run


def _sidecar(**keys: object) -> dict:
    return {"schema": SIDECAR_SCHEMA, "pid": 450, "rank": 0, "tp_rank": 0, "tp_size": 1, **keys}


def _analyze(run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    monkeypatch.setenv("COLUMNS", "250")
    out = run.parent / "out"
    assert main(["analyze", str(run), "--out", str(out)]) == 0
    return capsys.readouterr().out, json.loads((out / "summary.json").read_text())


def test_the_samples_sidecars_read_typed() -> None:
    side = read_sidecar(next((SAMPLE / "torch-sglang").glob("kvprof-sglang.*.json")))
    assert side.sglang_version == "0.5.23" and side.pools[0].cls == "MHATokenToKVPool"
    assert side.write_paths is None and side.graphs is None  # written before the plugin counted these
    assert side.file == "kvprof-sglang.TP-0.pid-1584.json"
    pp = plugin_paths([side])
    assert set(pp) == {"sglang_mha"} and pp["sglang_mha"].paths == {"fused": 80}


def test_sidecar_round_trips_through_the_plugins_encoding() -> None:
    side = Sidecar(schema=SIDECAR_SCHEMA, pid=7, pools=[SidecarPool(cls="MHATokenToKVPool", native_path="index_put")],
                   paths={"sglang:sglang_mha": 3}, device=SidecarDevice(name="NVIDIA H200", peak_bandwidth_gbs=4800.0,
                                                                         peak_bandwidth_source="spec table"))
    raw = encode_sidecar(side)
    assert b'"class": "MHATokenToKVPool"' in raw and b'"file"' not in raw
    back = decode_sidecar(raw, "x.json")
    assert back.pools == side.pools and back.device == side.device and back.paths == side.paths


@pytest.mark.parametrize(("raw", "says"), [
    (b"{not json", "not a kvprof engine sidecar (not JSON"),
    (json.dumps({"schema": "kvprof.summary/1"}).encode(), "not a kvprof engine sidecar (schema 'kvprof.summary/1'"),
    (json.dumps({"schema": SIDECAR_SCHEMA, "paths": {"sglang:sglang_mha": -3}}).encode(),
     "malformed kvprof engine sidecar (Expected `int` >= 0"),
    (json.dumps({"schema": SIDECAR_SCHEMA, "pid": "1584"}).encode(), "malformed kvprof engine sidecar (Expected `int"),
    (json.dumps({"pid": 3}).encode(), "malformed kvprof engine sidecar (Object missing required field `schema`)"),
    (json.dumps([1, 2]).encode(), "malformed kvprof engine sidecar (Expected `object`, got `array`)"),
])
def test_a_bad_sidecar_is_refused_in_one_line(tmp_path: Path, raw: bytes, says: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kvprof-sglang.TP-0.pid-1.json"
    path.write_bytes(raw)
    with pytest.raises(TraceError, match="kvprof-sglang.TP-0.pid-1.json: ") as err:
        read_sidecar(path)
    assert says in str(err.value) and "\n" not in str(err.value)
    run = _folder(tmp_path, raw)
    assert main(["analyze", str(run), "--no-files"]) == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in lines[0]


def test_verdict_from_the_plugins_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own store_cache path: one launch by the plugin's count and by the trace's kernels."""
    run = _folder(tmp_path, _sidecar(pools=[{"class": "MHATokenToKVPool", "variant": "sglang_mha",
                                             "native_path": "store_cache"}],
                                     paths={"sglang:sglang_mha": 80}, fallbacks={}))
    printed, summary = _analyze(run, capsys, monkeypatch)
    assert "sglang_mha: fused · paths say fused (fused x80, from the SGLang plugin) · GPU ops/write 1 x8" in printed
    v = summary["variants"]["sglang_mha"]
    assert (v["fused"], v["fused_by_paths"], v["fused_by_kernels"], v["agree"]) == (True, True, True, True)
    assert v["paths"] == {"fused": 80} and v["paths_source"] == PLUGIN_SOURCE and not v["fell_back"]
    from kvprof.dashboard.frames import verdicts_frame

    row = verdicts_frame(summary).set_index("variant").loc["sglang_mha"]
    assert row["verdict"] == "fused" and row["paths say"] == "fused (fused x80, from the SGLang plugin)"


def test_fused_into_rope_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run = _folder(tmp_path, _sidecar(paths={"sglang:fused_into_rope": 72}, write_paths={"fused into rope": 72},
                                     fallbacks={}, unattributed={}, expected_writes=72),
                  variant="sglang_fused_rope", kernel="void sglang::fused_rope_store_kernel<true>(Params)")
    printed, summary = _analyze(run, capsys, monkeypatch)
    assert ("sglang_fused_rope: fused into rope · paths say fused into rope (fused_into_rope x72, from the SGLang "
            "plugin) · GPU ops/write 1 x8") in printed
    v = summary["variants"]["sglang_fused_rope"]
    assert v["rope"] == "fused" and v["fused"] is True and v["paths"] == {"fused_into_rope": 72}
    from kvprof.dashboard.frames import verdicts_frame

    assert verdicts_frame(summary).set_index("variant").loc["sglang_fused_rope", "verdict"] == "fused into rope"


def test_a_writers_fallbacks_say_not_fused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """KVPROF_SGLANG_WRITER=triton_fused with one call left to SGLang: the writer fell back (with the
    reason the plugin logged); SGLang's own write of it took its index_put path, two copies."""
    reason = "input kvprof's checks refuse (k and v must be float16/bfloat16/float32, got torch.float64)"
    run = _folder(tmp_path, _sidecar(writer="triton_fused",
                                     pools=[{"class": "MHATokenToKVPool", "variant": "sglang_mha",
                                             "native_path": "index_put", "route": "writer:triton_fused"}],
                                     paths={"writer:triton_fused:fused": 18, "sglang:fallback": 1,
                                            "sglang:sglang_mha": 1},
                                     write_paths={"set_kv_buffer": 18, "fallback": 1}, fallbacks={reason: 1}),
                  variant="triton_fused", kernel="_store_kv_kernel")
    printed, summary = _analyze(run, capsys, monkeypatch)
    v = summary["variants"]["triton_fused"]
    assert v["fused_by_paths"] is False and v["fell_back"] is True and v["fallback_reasons"] == [reason]
    assert v["paths"] == {"fused": 18, f"fallback: {reason}": 1} and v["fused_claim"] is True
    assert "triton_fused: fused · paths say not fused (fused x18, fallback: input kvprof's checks refuse" in printed
    assert "fell back" in printed and "paths and kernel count disagree" in printed
    m = summary["variants"]["sglang_mha"]  # its one write: no range in the trace, the plugin's count only
    assert m["paths"] == {"two_copies": 1} and m["fused"] is False and m["sources"] == []


def test_a_path_the_plugin_cannot_judge_stays_undecided(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    side = Sidecar(schema=SIDECAR_SCHEMA, pools=[SidecarPool(variant="sglang_mha_fp4", native_path="quantized")],
                   paths={"sglang:sglang_mha_fp4": 4})
    pp = plugin_paths([side])["sglang_mha_fp4"]
    assert pp.paths == {} and pp.undecided == ["sglang:sglang_mha_fp4 x4: SGLang's path 'quantized' is not one "
                                               "kvprof judges"]


def test_peak_header_names_its_source(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A foreign trace with only the device's name: the spec table's figure; the plugin's record
    of the device (name, peak, source) where the trace names none; n/a with why otherwise."""
    side = _sidecar(paths={"sglang:sglang_mha": 4},
                    pools=[{"class": "MHATokenToKVPool", "variant": "sglang_mha", "native_path": "store_cache"}])
    printed, summary = _analyze(_folder(tmp_path / "a", side), capsys, monkeypatch)
    assert "(dir; device: NVIDIA H200, peak 4,800 GB/s (spec table))" in printed
    assert summary["device"]["peak_bandwidth_source"] == "spec table"

    recorded = {**side, "device": {"type": "cuda", "name": "Some Future GPU", "peak_bandwidth_gbs": 1024.0,
                                   "peak_bandwidth_source": "device properties"}}
    printed, summary = _analyze(_folder(tmp_path / "b", recorded, device_name=None), capsys, monkeypatch)
    assert "device: Some Future GPU, peak 1,024 GB/s (device properties))" in printed

    printed, _ = _analyze(_folder(tmp_path / "c", side, device_name="Some Future GPU"), capsys, monkeypatch)
    assert "device: Some Future GPU, peak n/a (not recorded, not in the spec table))" in printed


def test_the_h200_samples_verdicts() -> None:
    """The committed H200 runs: SGLang's store_cache and kvprof's Triton writer, both one launch
    by the plugin's counts and by the eager writes' kernels; the peak from the spec table."""
    for folder, variant, n in (("torch-sglang", "sglang_mha", 80), ("torch-triton_fused", "triton_fused", 80),
                               ("nsys-sglang", "sglang_mha", 72)):
        summary = kv.analyze(kv.open_run(SAMPLE / folder), write_kernels=True).summary
        v = summary.variants[variant]
        assert v.fused and v.agree and v.paths == {"fused": n} and v.paths_source == PLUGIN_SOURCE, folder
        assert v.paths_said() == f"fused (fused x{n}, from the SGLang plugin)"
        assert summary.device["name"] == "NVIDIA H200"
    torch_run = kv.analyze(kv.open_run(SAMPLE / "torch-sglang"), write_kernels=True).summary
    assert (torch_run.device["peak_bandwidth_gbs"], torch_run.device["peak_bandwidth_source"]) == (4800.0,
                                                                                                   "spec table")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_fallbacks_are_held_to_their_own_engines_count(engine: str) -> None:
    """A vLLM sidecar's fallbacks are counted under vllm:fallback: read, not refused as if they had
    to be SGLang's; more fallbacks by reason than the engine's count is still refused."""
    doc = Sidecar(schema=SIDECAR_SCHEMA, engine=engine, writer="paged_triton",
                  paths={f"{engine}:fallback": 8, f"{engine}:x": 8}, fallbacks={"its blocks are packed": 8})
    assert decode_sidecar(encode_sidecar(doc), "s.json").fallbacks == {"its blocks are packed": 8}
    other = "vllm" if engine == "sglang" else "sglang"
    bad = Sidecar(schema=SIDECAR_SCHEMA, engine=engine, writer="w", paths={f"{other}:fallback": 8},
                  fallbacks={"r": 8})
    with pytest.raises(TraceError, match=f"8 fallbacks by reason, but {engine}:fallback counts 0"):
        decode_sidecar(encode_sidecar(bad), "s.json")
