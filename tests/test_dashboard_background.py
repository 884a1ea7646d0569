"""The background server scripts and tests start the dashboard with: healthy, one-line errors, always stopped.

A plain ``python -m http.server`` stands in for Streamlit: it answers the same health path
from a folder, so these run without the dashboard extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kvprof.api as kv
from kvprof.core.errors import ToolError
from kvprof.tools.background import BackgroundServer, free_port


def _static_server(tmp_path: Path, log: Path | None = None) -> BackgroundServer:
    (tmp_path / "site" / "_stcore").mkdir(parents=True)
    (tmp_path / "site" / "_stcore" / "health").write_text("ok")
    port = free_port()
    return BackgroundServer([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(tmp_path / "site")], port, log=log)


def test_running_yields_a_healthy_url_and_stops_the_server(tmp_path):
    server = _static_server(tmp_path)
    with server.running(limit_s=60) as url:
        assert url == f"http://127.0.0.1:{server.port}/"
        assert server.healthy()
        with pytest.raises(ToolError, match="already running"):  # a second process would be left behind
            server.start()
    assert server.process is not None and server.process.returncode is not None
    assert not server.healthy()
    server.stop()  # a second stop is a no-op


def test_the_server_is_stopped_when_the_block_raises(tmp_path):
    server = _static_server(tmp_path)
    with pytest.raises(RuntimeError, match="inside"), server.running(limit_s=60):
        raise RuntimeError("inside")
    assert server.process is not None and server.process.returncode is not None


def test_a_server_that_exits_is_one_line_with_its_output(tmp_path):
    log = tmp_path / "server.log"
    server = BackgroundServer([sys.executable, "-c", "print('port taken'); print('giving up'); raise SystemExit(3)"],
                              free_port(), log=log)
    with pytest.raises(ToolError) as err, server.running(limit_s=60):
        pass
    assert str(err.value) == "the dashboard server exited with status 3: port taken | giving up"


def test_a_server_that_never_answers_is_stopped_after_the_limit(tmp_path):
    server = BackgroundServer([sys.executable, "-c", "import time; time.sleep(600)"], free_port())
    with pytest.raises(ToolError, match=r"did not answer within 1 s$"), server.running(limit_s=1):
        pass
    assert server.process is not None and server.process.returncode is not None


def test_the_facade_starts_kvprof_dashboard_on_a_free_port(tmp_path):
    server = kv.dashboard_server(tmp_path / "run", options=["--root", str(tmp_path)], cwd=tmp_path)
    assert server.command[1:5] == ["-m", "kvprof", "dashboard", str(tmp_path / "run")]
    assert server.command[5:] == ["--port", str(server.port), "--root", str(tmp_path)]
    assert server.process is None  # nothing started until asked
