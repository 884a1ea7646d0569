"""scrub leaves kvprof's own text alone: a fresh CPU capture, scrubbed, analyses to the same
variant reasons (the triton_fused hint "set TRITON_INTERPRET=1 before ..." included)."""

from __future__ import annotations

import json

import orjson
import pytest

from cli_support import end, kvprof_child
from kvprof.cli import main
from kvprof.tools.scrub import Rules

HINT = ("triton_fused on CPU runs in Triton's interpreter: set TRITON_INTERPRET=1 before "
        "kvprof.kvcache.writers.triton_fused is imported")


def test_own_advice_is_kept_and_environment_dumps_still_go():
    rules = Rules(env={})
    assert rules.scrub(HINT) == (HINT, None)
    assert rules.scrub("set KVPROF_SGLANG=1 and SGLANG_PLUGINS=kvprof")[1] is None
    for dump in ("PATH=/usr/bin TRITON_INTERPRET=1", "TRITON_INTERPRET=1 HF_HOME=/data", "KVPROF_NSYS=/opt/nsys"):
        assert rules.scrub(dump)[1] == "env", dump


def _reasons(doc: dict) -> dict[str, str]:
    return {name: v.get("reason") for name, v in doc["variants"].items()}


@pytest.mark.slow  # a capture in a child process
def test_scrub_then_analyze_keeps_the_variant_reasons(tmp_path, capsys):
    # with the interpreter turned off (kvprof keeps an explicit 0), triton_fused cannot run on
    # CPU and the manifest says why
    proc = kvprof_child("capture", "--device", "cpu", "--model", "small=2x1x64", "--phase", "decode",
                        "--batch-sizes", "1", "--steps", "4", "--warmup", "1", "--no-progress", "--out", str(tmp_path),
                        "--run-id", "r", env={"TRITON_INTERPRET": "0"})
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        end(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    run = tmp_path / "r"
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    before = _reasons(manifest)
    assert before["triton_fused"].startswith(HINT)
    summary_before = _reasons(orjson.loads((run / "summary.json").read_bytes()))
    assert summary_before["triton_fused"] == before["triton_fused"]

    assert main(["scrub", str(run)]) == 0
    capsys.readouterr()
    assert _reasons(orjson.loads((run / "manifest.json").read_bytes())) == before
    assert main(["analyze", str(run), "--json", "--no-files"]) == 0
    after = _reasons(json.loads(capsys.readouterr().out))
    assert after == summary_before
    assert "[kvprof:" not in json.dumps(after)
