"""The SIGINT handler kvprof's commands run under (see kvprof/core/interrupts.py for why)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from importlib.machinery import ExtensionFileLoader
from pathlib import Path

import pytest

from kvprof.core.interrupts import Interrupted, Terminated, ctrl_c_raises_interrupted


def test_sigint_raises_the_subclass_and_the_default_comes_back():
    with pytest.raises(KeyboardInterrupt) as exc, ctrl_c_raises_interrupted():
        signal.raise_signal(signal.SIGINT)
    assert type(exc.value) is Interrupted
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_someone_else_set_is_kept():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
    try:
        with ctrl_c_raises_interrupted():
            signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def _extension_module() -> str:
    """A standard-library module the path finder loads with ExtensionFileLoader."""
    for name in ("_bz2", "_lzma", "_csv", "_json", "_struct", "_queue", "_decimal", "_ssl", "_sqlite3"):
        spec = importlib.util.find_spec(name)
        if spec is not None and type(spec.loader) is ExtensionFileLoader:
            return name
    pytest.skip("no standard-library extension module is a shared object in this build")


def test_ctrl_c_while_an_extension_module_initialises_waits_until_it_returns(monkeypatch):
    """nanobind/pybind11 abort the process (SIGABRT) when Python code they call during a module's
    initialisation raises: Triton's import did, when Ctrl-C landed there. The signal is held and
    raised once the initialisation has returned."""
    name = _extension_module()
    events = []
    original = ExtensionFileLoader.exec_module

    def exec_module(self, module):  # what a nanobind module's init does: run Python code
        signal.raise_signal(signal.SIGINT)
        events.append("init went on")
        original(self, module)
        events.append("init returned")

    monkeypatch.setattr(ExtensionFileLoader, "exec_module", exec_module)
    monkeypatch.delitem(sys.modules, name)  # restored after the test
    with pytest.raises(KeyboardInterrupt) as exc, ctrl_c_raises_interrupted():
        importlib.import_module(name)
    assert type(exc.value) is Interrupted
    assert events == ["init went on", "init returned"]
    assert not [f for f in sys.meta_path if getattr(f, "__name__", "") == "_NativeImportFinder"]  # removed again


def test_sigterm_during_an_extension_modules_initialisation_wins_over_ctrl_c(monkeypatch):
    name = _extension_module()
    original = ExtensionFileLoader.exec_module

    def exec_module(self, module):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        original(self, module)

    monkeypatch.setattr(ExtensionFileLoader, "exec_module", exec_module)
    monkeypatch.delitem(sys.modules, name)
    with pytest.raises(KeyboardInterrupt) as exc, ctrl_c_raises_interrupted():
        importlib.import_module(name)
    assert type(exc.value) is Terminated
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("name", ["SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM"])
def test_a_signal_that_ends_a_process_raises_terminated_with_its_exit_code(name):
    signum = getattr(signal, name)
    with pytest.raises(KeyboardInterrupt) as exc, ctrl_c_raises_interrupted():
        signal.raise_signal(signum)
    assert type(exc.value) is Terminated and exc.value.signum == signum
    assert exc.value.exit_code == 128 + signum
    assert signal.getsignal(signum) == signal.SIG_DFL  # given back


def test_the_renames_that_belong_together_hold_sighup_too():
    from kvprof.core.interrupts import signals_deferred

    with pytest.raises(KeyboardInterrupt) as exc, ctrl_c_raises_interrupted():
        with signals_deferred():
            signal.raise_signal(signal.SIGHUP)  # blocked: the block runs on
            held = True
    assert held and type(exc.value) is Terminated and exc.value.signum == signal.SIGHUP


def _capture_child(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRITON_INTERPRET": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "kvprof", "capture", "--model", "llama-3.1-70b", "--steps", "400", "--variants",
         "index_put", "--device", "cpu", "--no-progress", "--no-summary", "--out", str(out), "--run-id", "t"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGHUP", "SIGQUIT", "SIGUSR1"])
def test_a_signal_during_capture_leaves_no_hidden_run_folder(tmp_path, name):
    """Each of these ended the process where it stood (SIGQUIT with a core dump) and left
    ``.t.tmp-PID-*`` in --out; now the capture unwinds as for SIGTERM."""
    signum = getattr(signal, name)
    proc = _capture_child(tmp_path)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(tmp_path.iterdir()) and proc.poll() is None:
            time.sleep(0.1)
        assert any(tmp_path.iterdir()), proc.communicate(timeout=60)[1].decode()[-2000:]
        time.sleep(0.5)  # inside the writes
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err.decode()[-2000:]
    last = err.decode().strip().splitlines()[-1]
    assert last == f"kvprof capture: terminated ({name}); nothing half-written was kept"
    assert b"Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_python_shuts_down_keeps_the_exit_code():
    """Once ``python -m kvprof`` has returned, a Ctrl-C in the interpreter's shutdown ended the
    process by signal (-2) with no message; now it is ignored and the command's code stands."""
    code = ("import atexit, os, runpy, signal, sys\n"
            "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"  # lands after the command
            "sys.argv = ['kvprof']\n"
            "runpy.run_module('kvprof', run_name='__main__', alter_sys=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr.decode()[-2000:]  # no command: help and 2
    assert b"KeyboardInterrupt" not in done.stderr and b"Traceback" not in done.stderr
    assert b"usage: kvprof" in done.stdout
