"""Daily use: a long default command says what it is doing before its slow imports."""

from __future__ import annotations

import argparse

import pytest

from kvprof.core.errors import UsageError


class _Bar:
    made: list[_Bar] = []

    def __init__(self, total, enabled=None, *, description="", width=14) -> None:
        self.texts = [description]
        self.total = total
        self.closed = False
        _Bar.made.append(self)

    def describe(self, text: str) -> None:
        self.texts.append(text)

    def set_total(self, total: int) -> None:
        self.total = total

    def advance(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def bars(monkeypatch):
    import kvprof.progress

    _Bar.made = []
    monkeypatch.setattr(kvprof.progress, "StepProgress", _Bar)
    return _Bar.made


def test_capture_shows_its_bar_before_it_loads_torch_and_closes_it_on_error(bars, monkeypatch):
    import kvprof.commands.capture as cmd

    def refuse(args):
        assert bars and bars[0].texts == ["loading torch"]  # on screen before the config (and torch) loads
        raise UsageError("refused")

    monkeypatch.setattr(cmd, "config_from_args", refuse)
    with pytest.raises(UsageError):
        cmd.run(argparse.Namespace(progress=True))
    assert bars[0].closed


def test_bench_shows_its_bar_before_it_loads_torch_and_closes_it_on_error(bars, monkeypatch):
    import kvprof.devinfo
    from kvprof.commands import bench

    def refuse(name):
        assert bars and bars[0].texts == ["loading torch"]
        raise UsageError("refused")

    monkeypatch.setattr(kvprof.devinfo, "resolve_device", refuse)
    with pytest.raises(UsageError):
        bench.run(argparse.Namespace(progress=True, device="cpu"))
    assert bars[0].closed
