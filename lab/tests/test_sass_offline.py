"""lab/sass_offline.py compiles the writer's kernel for sm_90 on this CPU machine with Triton's
bundled ptxas: the copy stores the loaded row words, the fp8 kernel casts them first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "sass_offline.py"


def _run(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_CACHE_DIR": str(tmp / "triton-cache")})


@pytest.mark.slow
def test_sass_of_the_bf16_copy_and_the_fp8_write(tmp_path):
    pytest.importorskip("triton")
    r = _run(tmp_path, "--shape", "8x128", "--tokens", "1", "--out", str(tmp_path / "sass"))
    assert r.returncode == 0, r.stderr
    bf16 = (tmp_path / "sass" / "8x128-1-bf16.sass").read_text()
    fp8 = (tmp_path / "sass" / "8x128-1-fp8.sass").read_text()
    assert "STG.E.128" in bf16 and "F2FP" not in bf16  # the copy stores what it loaded
    assert fp8.count("F2FP.SATFINITE.E4M3") == 4 and "STG.E " in fp8  # 2 x 2 paired casts, 4-byte stores
    assert fp8.count("\n") > bf16.count("\n")
    assert r.stdout.count("sha256") == 2


@pytest.mark.parametrize("args, words", [(("--shape", "8x"), "--shape must be HEADSxDIM"),
                                         (("--tokens", "0"), "--tokens must be at least 1")])
def test_bad_arguments_are_one_line(args, words, tmp_path):
    r = _run(tmp_path, *args)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0
