"""The commands that only read traces never import torch (it costs seconds before any work).

Each runs in a fresh interpreter, as a user would start it, and reports whether torch
was imported by the time the command returned.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "tests" / "fixtures" / "real"
SAMPLES = ROOT / "traces" / "samples" / "h200-llama70b-tp8"  # analysed: what `report` reads

PROBE = r"""
import runpy, sys
sys.argv = ["kvprof", *sys.argv[1:]]
try:
    runpy.run_module("kvprof", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("TORCH_IMPORTED" if "torch" in sys.modules else "TORCH_FREE", code, file=sys.stderr)
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([sys.executable, "-c", PROBE, *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("args", [
    ["--help"],
    ["analyze", "--help"],
    ["compare", "--help"],
    ["scrub", "--help"],
    ["capture", "--help"],
    ["analyze", "{run}", "--out", "{tmp}", "--quiet"],
    ["compare", "{run}", "--baseline", "two_stream", "--out", "{tmp}"],
    pytest.param(["scrub", "--check", "{tmp}/summary.json"], marks=pytest.mark.slow),  # after an analyze
    ["report", "--help"],
    ["report", "{samples}", "--html", "{tmp}/r.html"],
], ids=lambda a: " ".join(a).replace("{samples}", "SAMPLES").replace("{run}", "RUN").replace("{tmp}", "OUT"))
def test_reading_commands_do_not_import_torch(args: list[str], tmp_path: Path) -> None:
    if args[0] == "scrub" and args[1] == "--check":
        # something real to check: analyze's own output, made in this process's way
        made = _run(["analyze", str(RUN), "--out", str(tmp_path), "--quiet"], ROOT)
        assert made.returncode == 0, made.stderr[-2000:]
    argv = [a.replace("{run}", str(RUN)).replace("{tmp}", str(tmp_path)).replace("{samples}", str(SAMPLES))
            for a in args]
    done = _run(argv, ROOT)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("TORCH_FREE"), done.stderr[-3000:]
    assert last.split()[1] in ("0", "None"), done.stderr[-3000:]


HEAVY = ("pandas", "pyarrow", "numpy", "rich", "torch")


def _heavy_imported(args: list[str], heavy: tuple[str, ...]) -> str:
    """The command's last stderr line: the modules of ``heavy`` it imported (or LIGHT) and its exit code."""
    probe = PROBE.replace('"TORCH_IMPORTED" if "torch" in sys.modules else "TORCH_FREE"',
                          f'",".join(m for m in {heavy!r} if m in sys.modules) or "LIGHT"')
    proc = subprocess.Popen([sys.executable, "-c", probe, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    return err.strip().splitlines()[-1] if err.strip() else err


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["compare", "--help"], ["report", "--help"]],
                         ids=" ".join)
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    """Building the parser shows the benchmark's defaults (kvprof.core.benchmark) without
    importing the analysis (pandas alone cost 0.4 s of every command's start), rich or torch."""
    assert _heavy_imported(args, HEAVY) == "LIGHT 0"


@pytest.mark.parametrize("args", [["--format", "json"], ["--format", "csv"], ["--quiet"]], ids=" ".join)
def test_analyze_without_a_table_imports_no_rich(args: list[str]) -> None:
    """rich draws tables; an analyze that prints a document, or only the paths it wrote, never
    imports it (kvprof.report.renderers names its Console for type checking only)."""
    assert _heavy_imported(["analyze", str(RUN), "--no-files", *args], ("rich", "torch")) == "LIGHT 0"


def test_a_command_builds_only_its_own_parser() -> None:
    """``kvprof analyze ...`` imports no other command's module (50 ms of every start)."""
    probe = PROBE.replace('"TORCH_IMPORTED" if "torch" in sys.modules else "TORCH_FREE"',
                          '",".join(sorted(m for m in sys.modules if m.startswith("kvprof.commands.")))')
    proc = subprocess.Popen([sys.executable, "-c", probe, "analyze", "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert "usage: kvprof analyze" in out
    from kvprof.cli import COMMANDS

    loaded, code = err.strip().splitlines()[-1].rsplit(" ", 1)
    # the command line's helpers (kvprof.commands.argtypes) load with it; no other command does
    commands = [m for m in loaded.split(",") if m.rsplit(".", 1)[-1] in COMMANDS]
    assert (commands, code) == (["kvprof.commands.analyze"], "0"), err[-3000:]
