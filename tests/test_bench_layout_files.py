"""python -m kvprof.bench.layouts writes bench.json and bench.csv each in one step (kvprof.core.atomic),
under the run directory's names, with the bytes it wrote before."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvprof.core.rundir import RunDir

COLS = ["layout", "shape", "dtype", "tokens", "mode", "variant", "status", "median_us", "iqr_us", "host_us",
        "target_us", "meets_target", "gbs", "bytes", "reason"]


def _result(reason: object = "") -> dict:
    rec = {"layout": "mla", "shape": "(3, 1, 576)", "dtype": "bfloat16", "tokens": 3, "mode": "eager",
           "variant": "mla_triton", "status": "ok", "median_us": 1.5, "iqr_us": 0.1, "host_us": 2.0,
           "target_us": 3.0, "meets_target": True, "gbs": 1.25, "bytes": 3456, "reason": reason, "extra": [1]}
    return {"device": "cpu", "when": Path("x"), "records": [rec, dict(rec, variant="mla_cat_copy", reason="a, \"b\"")]}


def test_the_files_hold_what_they_held(tmp_path: Path) -> None:
    """The bytes of the direct writes this replaced: json.dumps(indent=1) and a csv.DictWriter table."""
    from kvprof.bench.layouts import write_files

    result = _result()
    write_files(result, tmp_path)
    assert (tmp_path / RunDir.BENCH).read_bytes() == (json.dumps(result, indent=1, default=str) + "\n").encode()
    expected = tmp_path / "expected.csv"
    with open(expected, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS, extrasaction="ignore")
        w.writeheader()
        w.writerows(result["records"])
    assert (tmp_path / RunDir.BENCH_CSV).read_bytes() == expected.read_bytes()


class _Unwritable(int):
    """A number JSON writes (int's own repr) and a CSV cell cannot (str())."""

    def __str__(self) -> str:
        raise RuntimeError("cannot be written")


def test_a_failed_write_keeps_the_previous_table_whole(tmp_path: Path) -> None:
    """A table that fails halfway leaves the previous bench.csv as it was, and no temporary file."""
    from kvprof.bench.layouts import write_files

    write_files(_result(), tmp_path)
    before = (tmp_path / RunDir.BENCH_CSV).read_bytes()
    with pytest.raises(RuntimeError, match="cannot be written"):
        write_files(_result(reason=_Unwritable(7)), tmp_path)
    assert (tmp_path / RunDir.BENCH_CSV).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([RunDir.BENCH, RunDir.BENCH_CSV])
