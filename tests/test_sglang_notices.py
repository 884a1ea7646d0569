"""The SGLang pieces where SGLang or CUDA is missing: a one-line notice, never an error."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from kvprof.integrations import sglang as plugin_mod
from kvprof.kvcache.writers import create_writer, writer_names


def test_plugin_off_unless_asked(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.delenv("KVPROF_SGLANG", raising=False)
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)  # would fail if imported
    with caplog.at_level(logging.DEBUG, logger="kvprof.sglang"):
        plugin_mod.plugin()
    assert not caplog.records


def test_plugin_without_sglang_is_a_one_line_notice(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture):
    monkeypatch.setenv("KVPROF_SGLANG", "1")
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", None)  # import raises ImportError
    with caplog.at_level(logging.INFO, logger="kvprof.sglang"):
        plugin_mod.plugin()
    assert len(caplog.records) == 1
    msg = caplog.records[0].getMessage()
    assert "HookRegistry is not importable" in msg and "\n" not in msg


def test_sglang_store_cache_says_why_not_on_cpu():
    assert "sglang_store_cache" in writer_names()
    w = create_writer("sglang_store_cache")
    reason = w.unsupported_reason(torch.device("cpu"), torch.bfloat16)
    if not torch.cuda.is_available():
        assert reason and "CUDA" in reason
