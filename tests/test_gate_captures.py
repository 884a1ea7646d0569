"""The regression gate on real CPU captures, each in its own process as CI makes them.

Identical captures must pass against each other: a shared machine runs one process up to
2x slower than another (seen here at a load of 6 on 2 cores), and the gate judges a
write's cost over the control series its own reference pass timed between the steps. The
threshold is 10 %, the one docs/formats.md gives for a shared CPU: over 156 rows of
identical captures the low end of the interval reached +6.0 % at most (at 5 %, 1 of 30
ordered pairs of small captures failed).
Triton's interpreter is left out (its time swings by 3x between identical runs). A real
slowdown must still fail: a third-party writer (``--writer module:factory``) whose NEW
version stores every K and V twice -- twice the writer's own work per call; what a write
costs the step rises by about 1.5-1.7x here, since the pool's own work per call is not
doubled. That test times 60 reference steps, not the CPU default of 10: under a burst of
load the machine ran the control 48-71 % slower in NEW, and over 10 steps the twice-writer's
+47 % had an interval of +7 .. +99 %; 60 steps narrow it about 4x (lab/gate_steps.py).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.cli import main

# serial: scripts/test.sh runs these alone, after the rest; beside a busy pytest worker the
# twice-writer's +44 % over the control had a 95 % interval starting at +2 %, under the 10 %
pytestmark = [pytest.mark.slow, pytest.mark.serial]

THRESHOLD = "10"
SMALL = ["--batch-sizes", "1", "--phase", "decode", "--no-progress", "--no-summary"]
WRITER = '''from kvprof.writers.index_put import IndexPutWriter


class GateWriter(IndexPutWriter):
    name = ""  # named after its spec: gate_writer.make
    description = "index_put, {how}"

    def write(self, *args, **kwargs):
{body}


def make(**options):
    return GateWriter(**options)
'''
ONCE = "        return super().write(*args, **kwargs)"
TWICE = "        super().write(*args, **kwargs)\n        return super().write(*args, **kwargs)"


def capture(out: Path, run_id: str, *args: str, path: Path | None = None) -> Path:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "kvprof", "capture", *SMALL, "--out", str(out), "--run-id", run_id,
                           *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out / run_id


def test_three_identical_captures_pass_against_each_other(tmp_path, capsys):
    from kvprof import api

    runs = [capture(tmp_path, f"same{i}", "--variants", "index_put,two_stream,triton_fused") for i in range(3)]
    opened = {r: api.open_run(r) for r in runs}
    analysed = {r: api.analyze(opened[r]) for r in runs}  # once each; the gate is compare's
    for before, after in itertools.permutations(runs, 2):
        gate = api.regression_gate(analysed[before], analysed[after], float(THRESHOLD), base_run=opened[before],
                                   new_run=opened[after])
        rows = [(r.variant, round(r.judged_pct, 1), round(r.low_pct or 0, 1)) for r in gate.rows]
        assert gate.passed and gate.comparable, (before.name, after.name, rows)
        assert {r.noise for r in gate.rows} == {"control"}
        assert {r.variant for r in gate.rows} == {"index_put", "two_stream"}
        assert [w.split(":")[0] for w in gate.left_out] == ["triton_fused decode 1"]
    # and the command says so with exit 0
    assert main(["compare", str(runs[0]), str(runs[2]), "--fail-if-slower", THRESHOLD]) == 0
    assert "gate: passed" in capsys.readouterr().out


def test_a_writer_that_writes_twice_fails_the_gate(tmp_path, capsys):
    once, twice = tmp_path / "once", tmp_path / "twice"
    for folder, body, how in ((once, ONCE, "once"), (twice, TWICE, "every write done twice")):
        folder.mkdir()
        (folder / "gate_writer.py").write_text(WRITER.format(body=body, how=how))
    args = ("--variants", "index_put", "--writer", "gate_writer:make", "--reference-steps", "60")
    base = capture(tmp_path, "base", *args, path=once)
    new = capture(tmp_path, "new", *args, path=twice)
    rc = main(["compare", str(base), str(new), "--fail-if-slower", THRESHOLD, "--json"])
    out, err = capsys.readouterr()
    gate = json.loads(out)["gate"]
    rows = {r["variant"]: r for r in gate["rows"]}
    assert rc == 1, err
    assert rows["gate_writer.make"]["regressed"] and rows["gate_writer.make"]["low_pct"] > 20, rows
    assert not rows["index_put"]["regressed"], rows
    assert "gate_writer.make" in err and "regressed" in err
    # the other way round it is faster: no regression
    assert main(["compare", str(new), str(base), "--fail-if-slower", THRESHOLD]) == 0
