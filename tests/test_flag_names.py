"""Messages from below kvprof/commands name settings by their fields; the command line spells
them as its flags, as it did when each message spelled its flag itself.

tests/test_layers.py holds every string outside the command line to no ``--flag``; here: each
field a message names is an option of a command, and a few converted messages print on the
command line byte for byte what they printed before the conversion (each expected line is
what the message printed then).
"""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.commands import FIELD_DEST, command_flags, flag_names
from kvprof.core.errors import rendered

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "kvprof"
FIXTURE = REPO / "tests" / "fixtures" / "layer-rope-cpu"


def _kvprof(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kvprof", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def _fields() -> set[str]:
    """Every field a ``Setting("...")`` in kvprof's code names."""
    return {n.args[0].value for f in PKG.rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Setting" and n.args
            and isinstance(n.args[0], ast.Constant)}


def test_every_setting_a_message_names_is_an_option_of_a_command() -> None:
    """flag_namer spells a field its parser lacks as ``--`` and the field's words; every field named
    is a real option of some command, so none is spelled by that guess alone."""
    from kvprof.cli import build_parser

    flags = flag_names(build_parser())
    assert sorted(f for f in _fields() if FIELD_DEST.get(f, f) not in flags) == []


def test_the_settings_converted_render_as_the_flags_they_spelled() -> None:
    from kvprof.commands import analyze, bench, capture, compare, nsys, scrub, verify
    from kvprof.commands.report import page_flags
    from kvprof.dashboard.settings import NAMED

    spelled = {
        analyze.add_arguments: {"write_kernel_regex": "--write-kernels", "max_events": "--max-events"},
        compare.add_arguments: {"include_interpreted": "--include-interpreted"},
        capture.add_arguments: {"reference_steps": "--reference-steps", "layers": "--layers", "context": "--context",
                                "pass_env": "--pass-env"},
        verify.add_arguments: {"pdl": "--pdl", "device": "--device", "layouts": "--layout", "variants": "--variants",
                               "seed": "--seed", "case": "--case"},
        bench.add_arguments: {"family": "--family"},
        scrub.add_arguments: {"max_bytes": "--max-bytes"},
        nsys.add_arguments: {"pass_env": "--pass-env"},
    }
    for add, fields in spelled.items():
        names = command_flags(add)
        assert {f: names(f) for f in fields} == fields
    assert compare.flags()("reference_steps") == "--reference-steps"  # capture's, named by compare's gate
    pages = page_flags()
    assert {f: pages(f) for f in NAMED} == {
        "variants": "--variants", "context": "--context", "decode_sizes": "--batch-sizes",
        "prefill_sizes": "--prefill-tokens", "html": "--html", "out": "--out"}


def test_a_bad_write_kernel_pattern_reads_as_before() -> None:
    done = _kvprof("analyze", "/nonexistent", "--write-kernels", "store_(")
    assert (done.returncode, done.stderr) == (
        2, "kvprof analyze: error: --write-kernels: not a regular expression (missing ) at position 7)\n")


def test_a_trace_over_max_events_reads_as_before() -> None:
    done = _kvprof("analyze", str(FIXTURE / "two_stream.pt.trace.json.gz"), "--no-files", "--max-events", "10")
    assert (done.returncode, done.stderr) == (
        3, "kvprof analyze: error: two_stream.pt.trace.json.gz: more than 10 events (counted 3,748 in the first 0 "
           "MiB); too large to load here: capture a shorter window, or raise --max-events on a machine with more "
           "memory\n")


def test_a_file_over_scrubs_limit_reads_as_before(tmp_path: Path) -> None:
    (tmp_path / "big.log").write_text("x" * 5000 + "\n")
    done = _kvprof("scrub", "--max-bytes", "1K", "big.log", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        2, f"kvprof scrub: {tmp_path / 'big.log'}: holds more than 1 KiB, scrub's limit for one file "
           "(--max-bytes raises it)\n")
    done = _kvprof("scrub", "--check", "--max-bytes", "1K", "big.log", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines()[0] == (
        "kvprof scrub: big.log: holds more than 1 KiB, scrub's limit for one file (--max-bytes raises it)")


@pytest.mark.slow
def test_the_pdl_check_on_a_cpu_reads_as_before() -> None:
    done = _kvprof("verify", "--pdl", "--device", "cpu")
    assert (done.returncode, done.stderr) == (
        4, "kvprof verify: error: verify --pdl needs a CUDA GPU with programmatic dependent launch (sm_90+); the "
           "device is cpu\n")


def test_pass_env_warnings_name_the_flag_of_the_command(caplog: pytest.LogCaptureFixture) -> None:
    from kvprof.commands import nsys
    from kvprof.tools.envsafe import child_environment

    with caplog.at_level(logging.WARNING, logger="kvprof"):
        child_environment({"HF_TOKEN": "hf_" + "a1B2" * 9}, pass_env=["NOT_SET_ANYWHERE", "HF_TOKEN"],
                          names=command_flags(nsys.add_arguments))
        child_environment({}, pass_env=["NOT_SET_ANYWHERE"])
    assert caplog.messages[:2] == [
        "--pass-env NOT_SET_ANYWHERE: not set in this environment, nothing passed",
        "--pass-env HF_TOKEN looks like a secret: the .nsys-rep will hold its value (scrub cleans exports, "
        "not .nsys-rep files)"]
    assert caplog.messages[2] == "pass_env NOT_SET_ANYWHERE: not set in this environment, nothing passed"


def test_the_dashboard_gets_the_flags_of_the_command_line_that_starts_it() -> None:
    """``kvprof dashboard`` hands its pages the flags they name; the HTML report of a run without a
    rotary or layer view says what to capture in them, as before."""
    import argparse

    import orjson

    from kvprof.commands import dashboard
    from kvprof.dashboard import landing
    from kvprof.dashboard.settings import setting_names

    args = argparse.Namespace(port=8501, max_upload_mb=200, address="127.0.0.1", root=None, run_dir=None,
                              cache_dir=None, open=False)
    _, env = dashboard.streamlit_command(args, app=REPO / "kvprof" / "dashboard" / "app.py")
    names = setting_names(env)
    summary = orjson.loads((REPO / "kvprof" / "samples" / "h200-llama70b-tp8" / "summary.json").read_bytes())
    land = landing.build("h200", summary)
    assert rendered(land.layer.rope_notes[0], names).startswith(
        "no rotary variant in this run: capture with --variants rope_then_triton_fused,rope_triton_fused (and the "
        "peers) to compare")
    assert rendered(land.layer.pdl_notes[0], names) == (
        "no decoder-layer context in this run: what PDL hides shows in a run captured with --context layer.")
    assert rendered(land.layer.pdl_notes[0], setting_names({})).endswith("captured with context layer.")


def test_the_dashboard_names_only_the_settings_it_is_handed() -> None:
    """Every setting a module of the dashboard names is one ``kvprof dashboard`` hands it a flag for."""
    from kvprof.dashboard.settings import NAMED

    named = {n.args[0].value for f in (PKG / "dashboard").rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Setting"}
    assert named and named <= set(NAMED)
