"""The regression gate on real CPU captures, each in its own process as CI makes them.

Identical captures must not fail against each other: a shared machine runs one process up
to 2x slower than another (seen here at a load of 6 on 2 cores), and the gate judges a
write's cost over the control series its own reference pass timed between the steps; a row
whose family-wise interval reaches both sides of the threshold is "too noisy to judge"
(inconclusive). A row is judged on its interval however wide, so an unchanged row falls
outside it at a rate (lab/gate_false_fails.py: 1 of 264 identical pairs at the default 10
steps, on a decode 64 control row); the identical captures here time decode 1 only, whose
rows fell outside in none of those pairs. The threshold is 10 %, the one docs/formats.md
gives for a shared CPU. Triton's interpreter is left
out (its time swings by 3x between identical runs). A real slowdown must still fail: a
third-party writer (``--writer module:factory``) whose NEW version stores every K and V
twice -- twice the writer's own work per call; what a write costs the step rises by about
1.5-1.7x here, since the pool's own work per call is not doubled -- and a torch whose
index_put does its work twice, which slows the control with the variants: the control's own
row (torch's index_put over numpy's) fails. Those captures time 60 reference steps, not the
CPU default of 10: under a burst of load the machine ran the control 48-71 % slower in NEW,
and over 10 steps the twice-writer's +47 % had an interval of +7 .. +99 %; 60 steps narrow
it about 4x (lab/gate_steps.py). A burst can still make one pair "too noisy to judge" (exit 8,
the gate's honest answer, not a false fail): that pair is captured again once and the gate's
second answer is the one asserted (``WriterRuns.judge``).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.analysis.gate import CONTROL_ROW
from kvprof.cli import main

# serial: scripts/test.sh runs these alone, after the rest; beside a busy pytest worker the
# twice-writer's +44 % over the control had a 95 % interval starting at +2 %, under the 10 %
pytestmark = [pytest.mark.slow, pytest.mark.serial]

THRESHOLD = "10"
SMALL = ["--batch-sizes", "1", "--phase", "decode", "--no-progress", "--no-summary"]
WRITER = '''from kvprof.kvcache.writers.index_put import IndexPutWriter


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
# a torch whose index_put does its work twice (a torch upgrade that made it slower), patched before kvprof
# is imported: python -c SLOW_TORCH capture ...
SLOW_TORCH = ("import runpy, sys, torch\n"
              "_set = torch.Tensor.__setitem__\n"
              "def _twice(self, index, value):\n"
              "    _set(self, index, value)\n"
              "    _set(self, index, value)\n"
              "torch.Tensor.__setitem__ = _twice\n"
              "sys.argv[0] = 'kvprof'\n"
              "runpy.run_module('kvprof', run_name='__main__', alter_sys=True)\n")


def capture(out: Path, run_id: str, *args: str, path: Path | None = None, slow_torch: bool = False) -> Path:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    kvprof = ["-c", SLOW_TORCH] if slow_torch else ["-m", "kvprof"]
    proc = subprocess.run([sys.executable, *kvprof, "capture", *SMALL, "--out", str(out), "--run-id", run_id,
                           *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out / run_id


def test_three_identical_captures_never_fail_against_each_other(tmp_path, capsys):
    from kvprof import api

    runs = [capture(tmp_path, f"same{i}", "--variants", "index_put,two_stream,triton_fused") for i in range(3)]
    opened = {r: api.open_run(r) for r in runs}
    analysed = {r: api.analyze(opened[r]) for r in runs}  # once each; the gate is compare's
    for before, after in itertools.permutations(runs, 2):
        gate = api.regression_gate(analysed[before], analysed[after], float(THRESHOLD), base_run=opened[before],
                                   new_run=opened[after])
        rows = [(r.variant, round(r.judged_pct, 1), round(r.low_pct or 0, 1), r.status) for r in gate.rows]
        # passed, or too noisy to judge on a loaded machine: never regressed
        assert gate.verdict in ("passed", "inconclusive") and gate.comparable, (before.name, after.name, rows)
        assert {(r.variant, r.noise) for r in gate.rows} == {("index_put", "control"), ("two_stream", "control"),
                                                             (CONTROL_ROW, "control check")}
        assert [w.split(":")[0] for w in gate.left_out] == ["triton_fused decode 1"]
    # and the command says so with exit 0 (passed) or 8 (inconclusive)
    rc = main(["compare", str(runs[0]), str(runs[2]), "--fail-if-slower", THRESHOLD])
    out = capsys.readouterr().out
    assert rc in (0, 8)
    assert ("gate: passed" if rc == 0 else "gate: inconclusive, too noisy to judge") in out


class WriterRuns:
    """BASE, NEW with the writer storing twice, NEW with torch's index_put doing its work twice;
    ``judge`` compares BASE with one NEW and, where the gate says "too noisy to judge" (exit 8:
    a load spike on a shared machine ran the control 94 % slower in one NEW here), captures
    that pair again once -- the gate's answer then, whatever it is, is the one asserted."""

    ARGS = ("--variants", "index_put", "--writer", "gate_writer:make")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.once, self.twice = root / "once_writer", root / "twice_writer"  # the writer's module, not runs
        for folder, body, how in ((self.once, ONCE, "once"), (self.twice, TWICE, "every write done twice")):
            folder.mkdir()
            (folder / "gate_writer.py").write_text(WRITER.format(body=body, how=how))
        # the reference steps left to their default: on a CPU, as many as fit the pass's budget (up to 100 here)
        self.base = self.capture("base")
        self.new = {"twice": self.capture("new_twice", path=self.twice),
                    "torch": self.capture("new_torch", slow_torch=True)}
        self.retakes = 0

    def capture(self, run_id: str, path: Path | None = None, slow_torch: bool = False) -> Path:
        return capture(self.root, run_id, *self.ARGS, path=path or self.once, slow_torch=slow_torch)

    def judge(self, which: str, capsys) -> tuple[int, str, str, Path, Path]:
        base, new = self.base, self.new[which]
        rc = main(["compare", str(base), str(new), "--fail-if-slower", THRESHOLD, "--json"])
        out, err = capsys.readouterr()
        if rc == 8:
            self.retakes += 1
            base = self.capture(f"base_again{self.retakes}")
            new = (self.capture(f"new_twice_again{self.retakes}", path=self.twice) if which == "twice" else
                   self.capture(f"new_torch_again{self.retakes}", slow_torch=True))
            rc = main(["compare", str(base), str(new), "--fail-if-slower", THRESHOLD, "--json"])
            out, err = capsys.readouterr()
        return rc, out, err, base, new


@pytest.fixture(scope="module")
def writer_runs(tmp_path_factory):
    return WriterRuns(tmp_path_factory.mktemp("writers"))


def test_a_writer_that_writes_twice_fails_the_gate(writer_runs, capsys):
    rc, out, err, base, new = writer_runs.judge("twice", capsys)
    gate = json.loads(out)["gate"]
    rows = {r["variant"]: r for r in gate["rows"]}
    assert rc == 1, err
    writer = rows["gate_writer.make"]
    # regressed: its slowdown and its interval's low end above the threshold. How far above is a matter of
    # the machine's load (12.7 % once beside other jobs): lab/gate_false_fails.py measures it over many pairs
    assert writer["regressed"] and writer["low_pct"] > float(THRESHOLD), rows
    # the unchanged rows of this one pair are not asserted unregressed: a row is judged on its interval however
    # wide, and how often an unchanged row falls outside its interval is a rate (lab/gate_false_fails.py, over
    # hundreds of pairs), not something one pair can show; what one pair shows is that the writer's row stands out
    assert all(r["judged_pct"] < writer["low_pct"] for v, r in rows.items() if v != "gate_writer.make"), rows
    assert "regressed: gate_writer.make decode 1" in err
    # the other way round the writer is faster: its row does not regress
    main(["compare", str(new), str(base), "--fail-if-slower", THRESHOLD, "--json"])
    back = {r["variant"]: r for r in json.loads(capsys.readouterr().out)["gate"]["rows"]}
    assert not back["gate_writer.make"]["regressed"] and back["gate_writer.make"]["judged_pct"] < 0, back


def test_a_torch_that_became_slower_fails_the_gate(writer_runs, capsys):
    # torch's index_put doing twice the work slows the variants and torch's control alike: divided by that
    # control alone the rows would pass; the control's own row, over numpy's, fails
    rc, out, err, _, _ = writer_runs.judge("torch", capsys)
    rows = {r["variant"]: r for r in json.loads(out)["gate"]["rows"]}
    assert rc == 1, err
    assert rows[CONTROL_ROW]["regressed"] and rows[CONTROL_ROW]["low_pct"] > float(THRESHOLD), rows
    assert f"regressed: {CONTROL_ROW} decode 1" in err
