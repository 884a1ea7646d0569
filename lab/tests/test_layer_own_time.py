"""lab/layer_own_time.py: a profiled trace's GPU activities tied to their graph replay by the launch's
correlation id (the step's slot copy outside the graph left out), and the whole script on a CPU."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import layer_own_time as lot  # noqa: E402


def _trace(path: Path, launches: int, with_launches: bool = True) -> None:
    events = []
    t = 1000.0
    for i in range(launches):
        if with_launches:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t, "dur": 5,
                           "args": {"correlation": 100 + i}})
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": t + 1, "dur": 1,
                       "args": {"correlation": 900 + i}})
        for j, name in enumerate(("gemm", "store")):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t + 10 + j * 3, "dur": 2.5,
                           "args": {"correlation": 100 + i}})
        t += 100.0
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_kernels_are_tied_to_their_replay(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    _trace(path, 3)
    rows = lot.gpu_rows(path)
    assert [(r["name"], r["replay"]) for r in rows] == [("gemm", 0), ("store", 0), ("gemm", 1), ("store", 1),
                                                         ("gemm", 2), ("store", 2)]
    assert rows[1]["start_ns"] == pytest.approx(1013_000.0) and rows[1]["dur_ns"] == pytest.approx(2500.0)
    _trace(path, 2, with_launches=False)
    assert {r["replay"] for r in lot.gpu_rows(path)} == {-1}
    assert len(lot.gpu_rows(path)) == 6  # the copies too: replays are then told by count


def test_report_reprints_a_saved_run(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{")
    r = subprocess.run([sys.executable, lot.__file__, "--report", str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "cannot read it" in r.stderr and "Traceback" not in r.stderr
    broken = tmp_path / "x.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00 not the rest of a stream")
    r = subprocess.run([sys.executable, lot.__file__, "--report", str(broken)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "a broken gzip stream" in r.stderr and "Traceback" not in r.stderr
    kept = Path(lot.__file__).parent / "results" / "h100-2026-12-08b" / "layer-own-time.json.gz"  # as results are kept
    r = subprocess.run([sys.executable, lot.__file__, "--report", str(kept)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "fp8 cache: each fused writer's saving" in r.stdout, r.stderr


@pytest.mark.slow
def test_the_script_runs_on_a_cpu(tmp_path: Path) -> None:
    """A tiny model, two variants, both cache dtypes: the JSON has every capture's steps (no
    kernels on a CPU: the split is n/a) and the fp8 saving against SGLang's generic write's
    torch version is computed."""
    script = Path(lot.__file__)
    env = {**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(script), "--model", "small=2x1x64", "--tp", "1", "--sizes", "1",
                           "--steps", "4", "--replays", "1", "--rotations", "2", "--context-len", "16",
                           "--variants", "index_put,set_kv_buffer_torch", "--generic", "set_kv_buffer_torch"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "layer-own-time.json").read_text())
    assert len(doc["captures"]) == 8 and len(doc["rows"]) == 8  # 2 dtypes x 2 rotations x 2 variants
    assert {(r["variant"], r["rotation"], r["position"]) for r in doc["rows"] if r["dtype"] == "bf16"} == {
        ("index_put", 0, 0), ("set_kv_buffer_torch", 0, 1), ("index_put", 1, 1), ("set_kv_buffer_torch", 1, 0)}
    (saving,) = doc["generic_savings"]  # --generic set_kv_buffer_torch: index_put against it
    assert saving["variant"] == "index_put" and saving["generic"] == "set_kv_buffer_torch"
    assert "fp8 cache: each fused writer's saving" in proc.stdout
    again = subprocess.run([sys.executable, str(script), "--report", str(tmp_path / "layer-own-time.json")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "fp8 cache: each fused writer's saving" in again.stdout


@pytest.mark.parametrize("args, words", [
    (["--variants", "triton_fused,nope"], "unknown --variants nope"),
    (["--dtypes", "bf16,fp8_e4m3,fp16"], "--dtypes takes one or two"),
    (["--dtypes", "bf17"], "--dtypes: cannot read 'bf17'"),
    (["--steps", "2"], "--steps >= 4"),
])
def test_bad_settings_are_one_line(args: list[str], words: str) -> None:
    r = subprocess.run([sys.executable, lot.__file__, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OUT": "/nonexistent-never-written"})
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr[-500:]
    assert r.stderr.strip().count("\n") == 0
