"""A dashboard server in the background of a script: started, healthy, then stopped whatever happens.

A process runner that knows only Streamlit's health endpoint, so it sits below ``kvprof.api``
(which starts the dashboard with it) rather than inside the dashboard, which sits above the api.

For code that drives the dashboard rather than a person at ``kvprof dashboard``: the
screenshots, the first-chart benchmark, the tests, a notebook. ``kvprof.api.dashboard_server``
starts ``kvprof dashboard`` this way; ``BackgroundServer`` takes any command that serves a
Streamlit app on ``port`` (another checkout, a plain ``streamlit run``, an installed entry point).

    with BackgroundServer(command, port).running(limit_s=60) as url:
        ...  # url answers; the process is stopped when the block ends
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from kvprof.core.errors import ToolError

HEALTH = "_stcore/health"  # Streamlit's own readiness endpoint
STOP_WAIT_S = 15.0  # after SIGTERM, before SIGKILL


def free_port() -> int:
    """A localhost port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """One server process: ``start``, ``wait_healthy``, ``stop`` (idempotent), or ``running()`` for all three.

    ``log``: a file that receives the server's stdout and stderr (its tail is in the error when
    it does not come up); without it the output is discarded."""

    def __init__(self, command: Sequence[str], port: int, *, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None, log: Path | None = None) -> None:
        self.command, self.port = list(command), port
        self.env, self.cwd, self.log = (dict(env) if env is not None else None), cwd, log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> BackgroundServer:
        if self.process is not None and self.process.poll() is None:
            raise ToolError(f"the dashboard server on port {self.port} is already running")
        sink: IO[bytes] | int = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=sink, stderr=subprocess.STDOUT)
        finally:
            if not isinstance(sink, int):
                sink.close()  # the child holds its own copy
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + HEALTH, timeout=1) as r:
                return bool(r.read().strip() == b"ok")
        except OSError:
            return False

    def wait_healthy(self, limit_s: float = 120.0, poll_s: float = 0.05) -> float:
        """Seconds until the health check answered; a ToolError (with the log's tail) if the process
        ended or ``limit_s`` passed first."""
        if self.process is None:
            raise ToolError("the dashboard server was not started")
        t = time.perf_counter()
        while not self.healthy():
            if self.process.poll() is not None:
                raise ToolError(f"the dashboard server exited with status {self.process.returncode}"
                                f"{self._tail()}")
            if time.perf_counter() - t > limit_s:
                raise ToolError(f"the dashboard server did not answer within {limit_s:.0f} s{self._tail()}")
            time.sleep(poll_s)
        return time.perf_counter() - t

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_WAIT_S``; always reaped."""
        p = self.process
        if p is None or p.returncode is not None:
            return
        p.terminate()
        try:
            p.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    @contextmanager
    def running(self, limit_s: float = 120.0) -> Iterator[str]:
        """Start, wait until healthy, yield the URL; stopped when the block ends, however it ends."""
        try:
            self.start().wait_healthy(limit_s)
            yield self.url
        finally:
            self.stop()

    def output(self) -> str:
        """What the server printed so far (its log), or '' without one."""
        try:
            return self.log.read_text(errors="replace") if self.log else ""
        except OSError:
            return ""

    def _tail(self, chars: int = 2000) -> str:
        """The log's last characters on one line (its lines joined by ' | ')."""
        text = " | ".join(x.strip() for x in self.output().strip()[-chars:].splitlines() if x.strip())
        return f": {text}" if text else ""
