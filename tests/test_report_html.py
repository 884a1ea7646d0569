"""kvprof report RUN --html: the landing view of the samples as one self-contained HTML file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly")

from cli_support import run_kvprof  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "samples" / "h200-llama70b-tp8"


def test_report_of_the_samples_is_self_contained(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    res = run_kvprof("report", str(SAMPLE), "--html", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "source reference" in res.stdout
    assert "<script src=" not in text  # plotly.js inlined, nothing fetched
    assert text.count("Plotly.newPlot") == 2
    assert "the reference pass" in text  # the source is named
    tables = re.findall(r"<table.*?</table>", text, flags=re.S)
    assert len(tables) == 2 and not any(re.search(r">\s*(None|nan)\s*<", t) for t in tables)
    for v in ("two_stream", "triton_fused", "cuda_fused"):
        assert v in tables[0]


def test_report_bad_input_is_one_line(tmp_path: Path) -> None:
    for args in (["report", str(tmp_path), "--html", str(tmp_path / "r.html")],
                 ["report", str(SAMPLE), "--html", str(tmp_path / "r.txt")],
                 ["report", str(SAMPLE), "--html", str(tmp_path / "r.html"), "--source", "perfetto"]):
        res = run_kvprof(*args)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (tmp_path / "r.html").exists()


def test_report_renderer_imports_neither_torch_nor_streamlit(tmp_path: Path) -> None:
    code = ("import argparse, sys; from pathlib import Path; import kvprof.commands.report as r; "
            f"r.run(argparse.Namespace(run=Path({str(SAMPLE)!r}), html=Path({str(tmp_path / 'r.html')!r}), "
            "source='kineto', baseline=None)); print(sorted(m for m in ('torch', 'streamlit') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"
