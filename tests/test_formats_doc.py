"""docs/formats.md lists every column and key the code writes, and every file names its schema."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import fields
from pathlib import Path

import pyarrow.parquet as pq

from kvprof.analysis.compare import RATIO_METRICS
from kvprof.analysis.gate import GateResult, GateRow
from kvprof.analysis.metrics import GROUP_COLUMNS
from kvprof.analysis.writes import WRITE_COLUMNS
from kvprof.cli import main
from kvprof.core.run import MANIFEST_SCHEMA, Manifest, VariantEntry
from kvprof.core.schema import SCHEMA
from kvprof.core.summary import SUMMARY_SCHEMA, Summary
from kvprof.report.files import EVENTS_SCHEMA, PARQUET_SCHEMA_KEY, WRITES_SCHEMA
from kvprof.trace.synthetic import TraceSpec, build, dumps

DOC = Path(__file__).resolve().parent.parent / "docs" / "formats.md"


def documented() -> set[str]:
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", DOC.read_text()))


def missing(names) -> list[str]:
    have = documented()
    return sorted(set(names) - have)


def test_every_table_column_is_documented():
    assert missing(SCHEMA.names) == []
    assert missing(WRITE_COLUMNS) == []
    assert missing(GROUP_COLUMNS) == []


def test_every_json_key_is_documented():
    assert missing(Summary(input="x", input_kind="run").to_json()) == []
    assert missing(Manifest().to_json()) == []
    entry = VariantEntry(reason="r", paths={}, kernels_per_write={}, bytes_per_token=1)
    assert missing(entry.to_json()) == []
    gate = GateResult(threshold_pct=5).to_json()
    assert missing([f.name for f in fields(GateRow)] + list(gate)) == []
    run_vs_run = [f"{side}_{m}" for m in RATIO_METRICS for side in ("before", "after")] + ["only_in", "runs",
                                                                                          "not_comparable"]
    assert missing(run_vs_run) == []


def test_every_schema_version_is_documented():
    text = DOC.read_text()
    for version in (SUMMARY_SCHEMA, MANIFEST_SCHEMA, EVENTS_SCHEMA, WRITES_SCHEMA, "kvprof.bench/1",
                    "kvprof.step_timings/1"):
        assert f"`{version}`" in text, version


def test_outputs_carry_their_schema(tmp_path, capsys):
    doc, _ = build(TraceSpec())
    trace = tmp_path / "two_stream.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(dumps(doc)))
    assert main(["analyze", str(trace), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["schema"] == SUMMARY_SCHEMA
    for name, version in (("events.parquet", EVENTS_SCHEMA), ("writes.parquet", WRITES_SCHEMA)):
        assert pq.read_schema(tmp_path / "o" / name).metadata[PARQUET_SCHEMA_KEY] == version.encode()
    assert Manifest().to_json()["schema"] == MANIFEST_SCHEMA


def test_bench_keys_are_documented(tmp_path, capsys):
    assert main(["bench", "--device", "cpu", "--variants", "index_put,sgl_kernel", "--shapes", "1x8",
                 "--tokens", "1", "--eager-repeats", "2", "--out", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["schema"] == "kvprof.bench/1"
    assert missing(result) == []
    assert missing({k for r in result["records"] for k in r}) == []
    assert missing(result["settings"]) == [] and missing(result["settings"]["floor_allocations"]) == []
    assert result["settings"]["torch_threads"] == 1


def test_every_sidecar_key_is_documented():
    """The engine plugins' sidecar: every key of every struct kvprof.core.sidecar defines (the
    document, its pools, device, graphs, ledger, shadow check and whatever is added later)."""
    import msgspec

    from kvprof.core import sidecar

    structs = [v for v in vars(sidecar).values()
               if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == sidecar.__name__]
    assert {s.__name__ for s in structs} >= {"Sidecar", "SidecarPool", "SidecarShadow", "ShadowMismatch"}
    for struct in structs:
        assert missing(f.encode_name for f in msgspec.structs.fields(struct)) == [], struct.__name__
    assert "`kvprof.engine_sidecar/1`" in DOC.read_text() and "`kvprof.sglang_sidecar/1`" in DOC.read_text()
