"""lab/bench_markdown.py: the docs' µs-per-write table, one row per point of the committed H200 run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "traces" / "samples" / "h200-bench" / "bench.json"


def _module():
    spec = importlib.util.spec_from_file_location("bench_markdown", ROOT / "lab" / "bench_markdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_markdown_has_one_row_per_point_of_the_golden_run(capsys):
    assert _module().main([str(GOLDEN)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 72  # header, rule, 4 shapes x 3 dtypes x 6 token counts
    assert lines[0].startswith("| shape | dtype | tokens | index_put |") and "| best kvprof |" in lines[0]
    assert lines[2].startswith("| 1x128 | bf16 | 1 | ")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_host_time_table_has_no_verdict_columns(capsys):
    assert _module().main([str(GOLDEN), "--mode", "eager", "--field", "writer_host_us"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 72 and "best kvprof" not in lines[0]


def test_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bench.json"
    bad.write_text("{}")
    assert _module().main([str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no records" in err[0]


def test_a_committed_gzipped_run_reads_as_its_json(tmp_path, capsys):
    """Results are kept gzipped (lab/results/*/bench-*.json.gz): the same table as the plain file."""
    import gzip

    gz = ROOT / "lab" / "results" / "h100-2026-12-08b" / "bench-fp8-1x128.json.gz"
    assert _module().main([str(gz)]) == 0
    from_gz = capsys.readouterr().out
    plain = tmp_path / "bench.json"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert _module().main([str(plain)]) == 0
    assert capsys.readouterr().out == from_gz and from_gz.count("\n") == 2 + 3


def test_a_broken_gzip_stream_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bench.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00 not the rest of a stream")
    assert _module().main([str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a broken gzip stream" in err[0]


def test_a_stream_that_inflates_past_the_trace_limit_is_one_line(tmp_path, capsys, monkeypatch):
    import gzip

    monkeypatch.setenv("KVPROF_MAX_TRACE_MB", "1")
    big = tmp_path / "bench.json.gz"
    big.write_bytes(gzip.compress(b'{"records": [], "pad": "' + b"x" * (2 << 20) + b'"}'))
    assert _module().main([str(big)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "larger than 1 MiB once inflated" in err[0]
