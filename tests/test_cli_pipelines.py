"""The CLI in a pipeline: one document on stdout for --json/--format, a closed pipe is exit 0
with nothing on stderr, tables follow COLUMNS, and nothing lands in the current folder."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pytest

from cli_support import end, kvprof_child
from kvprof.cli import main
from kvprof.trace.synthetic import PhaseSpec, TraceSpec, build, dumps

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pipe") / "run"
    folder.mkdir()
    for variant in ("two_stream", "index_put"):
        doc, _ = build(TraceSpec(variant=variant, phases=[PhaseSpec("decode", 8, 4, graph=True),
                                                          PhaseSpec("prefill", 64, 2)]))
        (folder / f"{variant}.pt.trace.json.gz").write_bytes(gzip.compress(dumps(doc), compresslevel=1))
    return folder


def test_analyze_json_is_one_document_and_paths_go_to_stderr(run_dir, tmp_path, capsys):
    assert main(["analyze", str(run_dir), "--json", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert set(doc["variants"]) == {"two_stream", "index_put"} and doc["groups"]
    assert str(tmp_path / "summary.json") in err


def test_analyze_csv_is_the_summary_csv(run_dir, tmp_path, capsys):
    assert main(["analyze", str(run_dir), "--format", "csv", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out == (tmp_path / "summary.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["variant"] for r in rows} == {"two_stream", "index_put"}


def test_compare_json_parses(run_dir, capsys):
    assert main(["compare", str(run_dir), "--baseline", "two_stream", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"] == "two_stream" and {r["variant"] for r in doc["rows"]} == {"index_put"}


def test_closing_the_pipe_is_not_an_error(run_dir):
    proc = kvprof_child("analyze", str(run_dir), "--no-files", cwd=ROOT)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # what `| head -1` does
        err = proc.stderr.read()
        rc = proc.wait(120)
    finally:
        end(proc)
    assert first.startswith(b"kvprof analyze")
    assert rc == 0 and err == b"", err.decode()[-2000:]


@pytest.mark.parametrize("columns, widest", [("90", 90), (None, 120)])
def test_piped_tables_follow_columns(run_dir, columns, widest):
    proc = kvprof_child("analyze", str(run_dir), "--no-files", cwd=ROOT, env={"COLUMNS": columns})
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        end(proc)
    assert proc.returncode == 0
    # table lines (box drawing) fit; the one-line warnings are soft-wrapped on purpose
    table = [line for line in out.decode().splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= widest


def test_bench_json_and_its_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--device", "cpu", "--variants", "index_put", "--shapes", "1x8", "--tokens", "1",
                 "--eager-repeats", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["records"] and {r["variant"] for r in doc["records"]} == {"index_put"}
    (made,) = (tmp_path / "cache" / "kvprof" / "bench").iterdir()
    assert json.loads((made / "bench.json").read_text())["records"] == doc["records"]
    assert str(made / "bench.json") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing in the current folder


def test_analyze_never_replaces_another_inputs_outputs_silently(run_dir, tmp_path, capsys):
    """analyze FILE run on two traces of one folder: the second is refused in one line (exit 6)
    and the first's outputs are kept; the same trace again replaces its own; --out writes the
    other's elsewhere, --force replaces the first's."""
    import shutil

    from kvprof.core.errors import OutputError
    from kvprof.core.rundir import RunDir

    folder = tmp_path / "traces"
    folder.mkdir()
    for trace in run_dir.iterdir():
        shutil.copy(trace, folder / trace.name)
    a, b = (folder / "two_stream.pt.trace.json.gz"), (folder / "index_put.pt.trace.json.gz")
    assert main(["analyze", str(a), "--quiet"]) == 0
    before = (folder / RunDir.SUMMARY).read_bytes()
    capsys.readouterr()
    assert main(["analyze", str(b), "--quiet"]) == OutputError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds the analysis of two_stream.pt.trace.json.gz" in err
    assert "--force" in err and (folder / RunDir.SUMMARY).read_bytes() == before
    assert main(["analyze", str(a), "--quiet"]) == 0  # the same input again: its own outputs
    assert main(["analyze", str(b), "--quiet", "--out", str(tmp_path / "b")]) == 0
    assert main(["analyze", str(b), "--quiet", "--no-files"]) == 0  # writes nothing: nothing to refuse
    assert main(["analyze", str(b), "--quiet", "--force"]) == 0
    assert RunDir(folder).read_summary().input == str(b)
    capsys.readouterr()
    assert main(["analyze", str(folder), "--quiet"]) == OutputError.exit_code  # the folder over b's
    assert "holds the analysis of index_put.pt.trace.json.gz" in capsys.readouterr().err
    assert main(["analyze", str(folder), "--quiet", "--force"]) == 0
    # a folder's own analysis stays its own after the folder is renamed
    moved = folder.rename(tmp_path / "renamed")
    assert main(["analyze", str(moved), "--quiet"]) == 0
