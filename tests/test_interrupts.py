"""The SIGINT handler kvprof's commands run under (see kvprof/core/interrupts.py for why)."""

from __future__ import annotations

import signal

import pytest

from kvprof.core.interrupts import Interrupted, ctrl_c_raises_interrupted


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
