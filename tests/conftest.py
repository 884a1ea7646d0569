"""Shared test setup: Triton runs under its interpreter on CPU; GPU tests skip without CUDA."""

from __future__ import annotations

import os
import signal

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import pytest
import torch

# A run started with `&` by a non-interactive shell inherits SIGINT ignored, and so would every
# process it starts: the Ctrl-C tests need it delivered, as it is in a terminal or CI.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run gpu/run_gpu_checks.sh on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
