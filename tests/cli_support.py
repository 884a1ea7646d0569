"""The kvprof command as tests run it: in this process through ``main``, or as a child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest


class CliResult(NamedTuple):
    rc: int
    out: str
    err: str


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    """``kvprof ARGS`` in this process, with what it printed; no traceback may reach stderr.

    argparse's refusals exit from inside ``main``: their SystemExit counts as the exit code.
    """
    from kvprof.cli import main  # on first use: the child-process helpers need none of kvprof

    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return CliResult(rc, out, err)


def child_env(env: dict[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment with ``env`` laid over it; a None value removes that variable."""
    merged: dict[str, str | None] = {**os.environ, **(env or {})}
    return {k: v for k, v in merged.items() if v is not None}


def kvprof_child(*args: str, env: dict[str, str | None] | None = None, cwd: Path | None = None,
                 **popen) -> subprocess.Popen[bytes]:
    """``python -m kvprof ARGS`` started with stdout and stderr piped; end it with :func:`end`."""
    return subprocess.Popen([sys.executable, "-m", "kvprof", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(env), cwd=cwd, **popen)


def end(proc: subprocess.Popen) -> None:
    """Whatever happened in the test, the child does not outlive it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def end_group(proc: subprocess.Popen) -> None:
    """``end`` for a child started with ``start_new_session=True``: its own children too."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def run_kvprof(*args: str, env: dict[str, str | None] | None = None, cwd: Path | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m kvprof ARGS`` run to its end (killed if it runs past ``timeout``), output as text."""
    return subprocess.run([sys.executable, "-m", "kvprof", *args], capture_output=True, text=True,
                          env=child_env(env), cwd=cwd, timeout=timeout)
