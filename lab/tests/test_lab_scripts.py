"""The lab's GPU scripts refuse a bad setting in one line, before they need a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, env, words", [
    ("fp8_ablation.py", {"ABL_CAPTURES": "three"}, "ABL_CAPTURES must be an integer"),
    ("tune_fused.py", {"TUNE_CAPTURES": "x"}, "cannot read TUNE_CAPTURES"),
    ("tune_fused.py", {"TUNE_CAPTURES": "0"}, "TUNE_CAPTURES must be at least 1"),
    ("rope_bench.py", {"ROPE_REPLAYS": "many"}, "ROPE_REPLAYS must be an integer"),
    ("rope_bench.py", {"ROPE_VARIANTS": "rope_cuda_fused,nope"}, "unknown ROPE_VARIANTS nope"),
    ("rope_bench.py", {"ROPE_CACHE": "fp32"}, "ROPE_CACHE must be bf16, fp8_e4m3 or fp8_e5m2"),
    ("rope_bench.py", {"ROPE_VARIANTS": "rope_triton_fused@16.1.3t"},
     "ROPE_VARIANTS rope_triton_fused@16.1.3t: num_warps must be 1, 2, 4, 8 or 16, got 3"),
    ("rope_bench.py", {"ROPE_VARIANTS": "rope_triton_fused@12.1.8"},
     "ROPE_VARIANTS rope_triton_fused@12.1.8: block_t must be a power of two, got 12"),
    ("rope_bench.py", {"ROPE_VARIANTS": "copy:5377"}, "ROPE_VARIANTS copy:5377: the bytes a token must be even"),
])
def test_lab_scripts_refuse_a_bad_setting_in_one_line(script, env, words):
    r = subprocess.run([sys.executable, str(LAB / script)], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_dashboard_ab_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    r = subprocess.run([sys.executable, str(LAB / "dashboard_ab.py"), "fresh", f"a={tmp_path}", f"b={LAB.parent}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is not NAME=CHECKOUT" in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("args, words", [
    (["--steps", "ten"], "cannot read --steps"),
    (["--steps", "2"], "--steps each >= 4"),
    (["--pairs", "0"], "--pairs >= 1"),
])
def test_gate_steps_refuses_a_bad_setting_in_one_line(args, words):
    r = subprocess.run([sys.executable, str(LAB / "gate_steps.py"), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_default_walltimes_refuses_an_unknown_command_in_one_line():
    proc = subprocess.run([sys.executable, str(LAB / "default_walltimes.py"), "--only", "nope"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--only: unknown nope; choose from capture" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--runs", "1"], "--runs >= 2"),
    (["--reference-steps", "3"], "--reference-steps >= 4"),
    (["--busy", "-1"], "--busy >= 0"),
])
def test_gate_false_fails_refuses_a_bad_setting_in_one_line(args, words):
    r = subprocess.run([sys.executable, str(LAB / "gate_false_fails.py"), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0


def test_rope_bench_copy_floor_moves_the_bytes_it_names_from_buffers_of_its_own(monkeypatch):
    import importlib.util

    import torch

    # the script sets TRITON_INTERPRET=0 as it is imported (for the GPU): this process's value
    # comes back after the test, for the tests that run after it here
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    spec = importlib.util.spec_from_file_location("rope_bench", LAB / "rope_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.copy_floor("rope_triton_fused") is None
    assert module.copy_floor("copy:5376")().bytes_per_token == 5376
    pairs = module.copy_pairs(4096, 5376, 3, torch.device("cpu"))
    assert len(pairs) == 3
    assert all(s.numel() == d.numel() == 4096 * 2688 for s, d in pairs)
    assert len({t.data_ptr() for pair in pairs for t in pair}) == 6
