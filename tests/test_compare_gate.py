"""The regression gate (compare BASE NEW --fail-if-slower PCT), compare's output formats and
its output location: nothing is written into an input folder."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from xml.etree import ElementTree as ET

import pandas as pd
import pytest

from kvprof.analysis.gate import regression_gate
from kvprof.analysis.metrics import GROUP_COLUMNS
from kvprof.cli import main
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps


def groups(*rows: dict) -> pd.DataFrame:
    full = []
    for r in rows:
        row = {c: math.nan for c in GROUP_COLUMNS}
        row.update(layer="all", writes=40, steps=10)
        row.update(r)
        full.append(row)
    return pd.DataFrame(full)[list(GROUP_COLUMNS)]


def point(variant="triton_fused", source="reference", phase="decode", size=8, cost=1000.0, iqr=400.0):
    # 4 writes a step: the per-write spread is iqr / 4
    return {"variant": variant, "source": source, "phase": phase, "size": size, "cost_per_write_ns": cost,
            "step_iqr_ns": iqr}


def test_slower_beyond_threshold_and_spread_regresses():
    gate = regression_gate(groups(point(cost=1000, iqr=400)), groups(point(cost=1300, iqr=400)), 5)
    (row,) = gate.rows
    assert row.regressed and not gate.passed
    assert row.slower_pct == pytest.approx(30.0)
    assert row.base_iqr_ns == pytest.approx(100.0) and row.spread_ns == pytest.approx(200.0)


def test_slower_than_threshold_but_inside_the_spread_passes():
    # 30 % slower, but the runs scatter by 2 x 400 ns per write: not a regression
    gate = regression_gate(groups(point(cost=1000, iqr=1600)), groups(point(cost=1300, iqr=1600)), 5)
    assert gate.passed and gate.rows[0].spread_ns == pytest.approx(800.0)


def test_beyond_spread_but_under_threshold_passes():
    gate = regression_gate(groups(point(cost=1000, iqr=0)), groups(point(cost=1040, iqr=0)), 5)
    assert gate.passed and gate.rows[0].slower_pct == pytest.approx(4.0)


def test_faster_and_identical_pass():
    assert regression_gate(groups(point()), groups(point()), 0).passed
    assert regression_gate(groups(point(cost=1000)), groups(point(cost=500)), 5).passed


def test_unknown_spread_is_judged_on_the_threshold_alone():
    gate = regression_gate(groups(point(iqr=math.nan)), groups(point(cost=1100, iqr=math.nan)), 5)
    (row,) = gate.rows
    assert row.regressed and not row.spread_known
    assert gate.to_json()["rows"][0]["spread_known"] is False


def test_the_most_trusted_common_source_is_judged():
    base = groups(point(source="reference", cost=1000), point(source="kineto", cost=5000))
    new = groups(point(source="reference", cost=1000), point(source="kineto", cost=9000))
    gate = regression_gate(base, new, 5, source_order=["reference", "kineto"])
    assert [(r.source, r.regressed) for r in gate.rows] == [("reference", False)]
    # the reference missing from NEW: the profiler both measured decides
    gate = regression_gate(base, groups(point(source="kineto", cost=9000)), 5, source_order=["reference", "kineto"])
    assert [(r.source, r.regressed) for r in gate.rows] == [("kineto", True)]


def test_points_in_one_run_only_are_named():
    gate = regression_gate(groups(point(), point(variant="index_put")), groups(point(), point(size=64)), 5)
    assert len(gate.rows) == 1
    assert sorted(gate.unjudged) == ["index_put decode 8: not measured in NEW", "triton_fused decode 64: not measured in BASE"]


def test_a_negative_threshold_is_refused():
    with pytest.raises(ValueError):
        regression_gate(groups(point()), groups(point()), -1)


# --- the command, on synthetic traces with known kernel durations ---------------------------------

def _run(folder: Path, k_ns: int) -> Path:
    folder.mkdir(parents=True)
    for variant in ("two_stream", "triton_fused"):
        spec = TraceSpec(variant=variant, layers=[0, 1, 2, 3], phases=[PhaseSpec("decode", 8, 6, graph=True)],
                         write=WriteSpec([KernelSpec(7, 0, k_ns if variant == "triton_fused" else 2500)]))
        doc, _ = build(spec)
        (folder / f"{variant}.pt.trace.json.gz").write_bytes(gzip.compress(dumps(doc), compresslevel=1))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    return _run(root / "base", 2500), _run(root / "slow", 3500)  # triton_fused's kernel 40 % longer


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_planted_slowdown_fails_the_gate(runs, tmp_path, capsys):
    base, slow = runs
    before = _listing(base), _listing(slow)
    junit = tmp_path / "gate.xml"
    assert main(["compare", str(base), str(slow), "--fail-if-slower", "5", "--junit", str(junit), "--json"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout holds one document
    assert doc["gate"]["passed"] is False
    bad = [r for r in doc["gate"]["rows"] if r["regressed"]]
    assert {r["variant"] for r in bad} == {"triton_fused"}
    assert all(r["slower_pct"] > 5 for r in bad)
    assert "regressed" in err and "triton_fused" in err
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert len(cases) == len(doc["gate"]["rows"]) and int(suite.get("failures")) == len(bad)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed and all(n.startswith("triton_fused ") for n in failed)
    assert (_listing(base), _listing(slow)) == before  # nothing written into the inputs


def test_identical_runs_pass_the_gate(runs, capsys):
    base, _ = runs
    assert main(["compare", str(base), str(base), "--fail-if-slower", "5"]) == 0
    out = capsys.readouterr().out
    assert "gate: passed" in out


def test_compare_writes_only_into_out(runs, tmp_path, capsys):
    base, slow = runs
    assert main(["compare", str(base), str(slow), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split(",")
    assert header[:4] == ["variant", "source", "phase", "size"]
    assert "compare.json" not in _listing(base) + _listing(slow)
    assert main(["compare", str(base), "--out", str(tmp_path / "o"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "o" / "compare.json").read_text()) == doc


@pytest.mark.parametrize("args", [["--fail-if-slower", "5"], ["SECOND", "--junit", "x.xml"],
                                  ["SECOND", "--fail-if-slower", "-3"], ["SECOND", "--fail-if-slower", "nan"]])
def test_gate_usage_errors_are_one_line(runs, capsys, args):
    base, slow = runs
    argv = ["compare", str(base), *[str(slow) if a == "SECOND" else a for a in args]]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit from inside parse_args
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
