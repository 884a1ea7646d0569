"""python -m kvprof.bench.layouts writes bench.json and bench.csv each in one step (kvprof.core.atomic),
under the run directory's names, with the bytes it wrote before."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvprof.core.rundir import RunDir

COLS = ["layout", "shape", "dtype", "tokens", "mode", "variant", "status", "median_us", "iqr_us", "host_us",
        "writer_host_us", "target_us", "meets_target", "gbs", "bytes", "reason"]


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


@pytest.mark.parametrize("layout, variant", [("mla", "mla_cat_copy"), ("paged", "paged_unfused")])
def test_an_eager_point_times_the_writer_alone_beside_the_pool(layout: str, variant: str) -> None:
    """Eager rows carry the host time of the writer's own launch path (no pool or contract checks),
    as the MHA bench's "writer alone" column does, and the text table shows both."""
    import torch

    from kvprof.bench.layouts import LayoutCase, LayoutPoint, bench_point, table
    from kvprof.kvcache.layouts import registry

    case = LayoutCase(LayoutPoint(layout, "bf16", "bf16", 4), torch.device("cpu"), 1 << 20, 0)
    writer = registry.create_writer(layout, variant)
    (rec,) = bench_point(case, variant, writer, replays=2, eager_repeats=3, modes=("eager",))
    assert rec["status"] == "ok", rec
    assert rec["writer_host_us"] > 0 and rec["writer_host_iqr_us"] >= 0 and rec["host_us"] > 0
    text = table({"records": [dict(rec, target_us=1.0, gbs=1.0, meets_target=False)]})
    assert f"{rec['host_us']:7.2f} / {rec['writer_host_us']:.2f}" in text
