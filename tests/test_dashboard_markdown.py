"""Text from a trace is shown as text: a device name or warning holding Markdown must not become
an image the browser fetches, a link, or styled text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest

from dashboard_support import REPO
from kvprof.trace.synthetic import PhaseSpec, TraceSpec, build, dumps

INJECTED = "![](http://attacker.invalid/x)"
UNESCAPED = re.compile(r"(?<!\\)!\\?\[|(?<!\\)\]\(")  # "![" or "](" not preceded by a backslash


def test_md_escapes_every_markdown_construct():
    from kvprof.dashboard.ui import md

    assert md(INJECTED) == r"\!\[\]\(http\://attacker\.invalid/x\)"
    assert md(":red[x] $y$ <img src=x> **b**\nnext") == r"\:red\[x\] \$y\$ \<img src\=x\> \*\*b\*\* next".replace(
        r"\=", "=")


def test_injected_device_name_and_warning_render_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprof.analysis.summary import analyze
    from kvprof.report.files import write_analysis
    from kvprof.trace.load import load

    doc, _ = build(TraceSpec(phases=[PhaseSpec("prefill", 64, 2)]))
    doc["deviceProperties"][0]["name"] = INJECTED
    doc["kvprof"]["device"]["name"] = INJECTED
    doc["kvprof"]["layers"] = "not a list"  # makes analyze warn, quoting nothing but still a warning
    run = tmp_path / "root" / "run"
    run.mkdir(parents=True)
    (run / f"{INJECTED[:2]}t.json").write_bytes(dumps(doc))
    loaded = load(run)
    result = analyze(loaded)
    result.summary.to_json()["warnings"].append(f"planted {INJECTED}")
    write_analysis(loaded, result, run)

    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(run.parent))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(run))
    at = AppTest.from_file(str(REPO / "kvprof" / "dashboard" / "app.py"), default_timeout=90).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [str(e.value) for kind in ("markdown", "caption", "warning", "info", "error", "subheader")
             for e in at.get(kind)]
    shown += [str(m.label) for m in at.get("metric")]
    joined = "\n".join(shown)
    assert "attacker" in joined  # the text is there, as text
    assert not [s for s in shown if UNESCAPED.search(s) and "attacker" in s], joined
