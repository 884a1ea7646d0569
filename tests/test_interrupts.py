"""The SIGINT handler kvprof's commands run under (see kvprof/core/interrupts.py for why)."""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
from importlib.machinery import ExtensionFileLoader

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
