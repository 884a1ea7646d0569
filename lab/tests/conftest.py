"""Lab tests: Triton runs under its interpreter on CPU; GPU tests skip without CUDA (as in tests/)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run gpu/run_gpu_checks.sh on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
