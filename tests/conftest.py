"""Shared test setup: Triton runs under its interpreter on CPU; GPU tests skip without CUDA."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator

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


@pytest.fixture(autouse=True)
def _recursion_limit() -> Iterator[None]:
    """Each test leaves the recursion limit as it found it. torch.compile's inductor
    raises it to 2000 for good (torch/_inductor/compile_fx.py), and the nesting a trace reader
    accepts before RecursionError follows it: without this, the deep-nesting tests passed or
    failed by whether a torch_compile test had run earlier in the same process."""
    limit = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(limit)


@pytest.fixture(scope="session")
def signature_helper() -> object:
    """kvprof.kvcache.signature with its C++ helper loaded (built once per machine), or the
    test skipped where it cannot be (switched off, no C++ compiler)."""
    from kvprof.kvcache import signature

    if signature.state() == f"{signature.ENV_SIGNATURE}=0":
        pytest.skip(f"{signature.ENV_SIGNATURE}=0 in the environment")
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler to build the signature helper")
    why = signature.load()
    assert why is None, why
    return signature
