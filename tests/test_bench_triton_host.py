"""benchmarks/bench_triton_host.py runs on a CPU and times every Triton writer's own host path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_it_times_each_triton_writer_with_the_launch_stubbed() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_triton_host.py"), "--calls", "20",
                        "--repeats", "2", "--tokens", "4"], capture_output=True, text=True, timeout=300, env=env,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    built = lines[1] == "the launcher's C++ signature helper: built"
    rows = {}
    assert lines[-1].startswith("# eight tensors' dtype, device, address, shape and strides: Python ")
    for line in lines[3:-1]:
        m = re.fullmatch(r"(.+?)\s+([\d.]+)\s+([\d.]+)\s+(?:([\d.]+)\s+([\d.]+)\s+([\d.]+)|n/a)", line.strip())
        assert m, line
        rows[m[1]] = (float(m[2]), None if m[4] is None else float(m[4]))
    assert set(rows) == {"triton_fused bf16", "triton_fused fp8", "triton_fused hw bf16", "triton_fused hw fp8",
                         "rope_triton_fused bf16", "mla_triton bf16", "paged_triton bf16"}
    assert all(python > 0 and (signed is not None and signed > 0) == built for python, signed in rows.values())


def test_bad_counts_are_refused_in_one_line() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_triton_host.py"), "--calls", "0"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == ["bench_triton_host.py: --calls, --repeats and --tokens must be positive"]
