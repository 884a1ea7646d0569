"""The names of nsys's files and bench's, as kvprof.core.rundir.RunDir spells them for every module."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvprof.core.rundir import RunDir


@pytest.mark.parametrize(("given", "base"), [("prof", "prof"), ("prof.nsys-rep", "prof"), ("a.b.nsys-rep", "a.b"),
                                              ("out/x.nsys-rep", "out/x"), ("x.qdrep", "x.qdrep"),
                                              ("x.nsys-rep.nsys-rep", "x.nsys-rep")])
def test_an_nsys_output_base_loses_one_trailing_report_suffix(given: str, base: str) -> None:
    """``kvprof nsys --out prof.nsys-rep`` and ``--out prof`` write the same files (nsys adds .nsys-rep)."""
    assert RunDir.nsys_base_of(Path(given)) == Path(base)


def test_the_files_of_one_base() -> None:
    base = Path("runs/r/cuda_fused")
    assert RunDir.nsys_report_of(base) == Path("runs/r/cuda_fused.nsys-rep")
    assert RunDir.nsys_stream_of(base) == Path("runs/r/cuda_fused.qdstrm")
    assert RunDir.nsys_sqlite_of(base) == Path("runs/r/cuda_fused.sqlite")
    assert RunDir(Path("runs/r")).nsys_sqlite("cuda_fused") == RunDir.nsys_sqlite_of(base)


@pytest.mark.parametrize(("report", "export"), [("a.nsys-rep", "a.sqlite"), ("d/a.b.nsys-rep", "d/a.b.sqlite"),
                                                ("old.qdrep", "old.sqlite")])
def test_a_reports_export_beside_it(report: str, export: str) -> None:
    assert RunDir.nsys_export_beside(Path(report)) == Path(export)


def test_a_report_with_its_export_beside_it_is_read_once(tmp_path: Path) -> None:
    """A trace folder's .nsys-rep is skipped when its .sqlite export is there (trace/load.py)."""
    import kvprof.trace.load as load

    (tmp_path / "v.nsys-rep").write_bytes(b"report")
    (tmp_path / "w.nsys-rep").write_bytes(b"report")
    (tmp_path / "v.sqlite").write_bytes(b"SQLite format 3\x00")
    read: list[str] = []

    def fake(path: Path, *args: object, **kwargs: object) -> None:
        read.append(path.name)
        raise load.NotThisFormat("not read here")  # skipped with a warning: the scan goes on

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load, "load_file", fake)
        with pytest.raises(load.TraceError):
            load.load_dir(tmp_path)
    assert read == ["v.sqlite", "w.nsys-rep"]


def test_bench_writes_its_files_under_rundir_names(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert (run.bench.name, run.bench_csv.name) == ("bench.json", "bench.csv")
