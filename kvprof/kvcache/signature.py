"""One C++ call that reads what a write's host path reads of its tensors, and bounded memos keyed by it.

``SIGNATURE(*tensors)`` (``csrc/tensor_signature.cpp``, built once per machine through
:mod:`kvprof.kvcache.cuda_build` with a C++ compiler, no CUDA) returns bytes of every tensor's
dtype, device, rank, sizes, strides and 16-byte alignment, and the tensors' addresses: a fraction
of a µs for eight tensors, where Python's attribute reads take several. ``CALL_KEY(*args)`` is
one bytes object for a whole call: each tensor's signature and address, and every other
argument's exact type and value (None, bool, int, float, torch.dtype). Two calls with equal keys
agree in everything a writer's contract checks or its launch plan reads but their tensors'
values, so both keep what they computed for one call under its key and reuse it (``keep``): the
contracts' checks (:meth:`kvprof.kvcache.contracts.ChecksItsCalls.checked_call`) and the Triton
writers' launches (:mod:`kvprof.kvcache.writers.triton_launch`).

None for anything it does not read -- a tensor subclass, no storage, sparse, rank above 8, more
than 32 arguments, another argument type -- and the caller takes its Python path. Not built
(the Python path everywhere) without a C++ compiler or with ``KVPROF_TRITON_SIGNATURE=0`` in
the environment at import; :func:`state` says which.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_SIGNATURE = "KVPROF_TRITON_SIGNATURE"  # "0": no C++ helper; every call checked and keyed in Python
MEMO_LIMIT = 4096  # entries of one memo: prefill token counts are many, so a memo is cleared past it

_LOCK = threading.Lock()

# signature(*tensors) -> (bytes, addresses) | None and call_key(*args) -> bytes | None, once built
# (read per call); why not, else
SIGNATURE: Callable[..., tuple[bytes, tuple[int, ...]] | None] | None = None
CALL_KEY: Callable[..., bytes | None] | None = None
_why: str | None = (f"{ENV_SIGNATURE}=0" if os.environ.get(ENV_SIGNATURE, "1").strip().lower()
                    in ("0", "false", "no", "off") else None)
_tried = _why is not None


def load() -> str | None:
    """Build (the first time on a machine) or load the C++ helper, once per process; None
    when ``SIGNATURE`` is set, else why not (one line)."""
    global SIGNATURE, CALL_KEY, _why, _tried
    with _LOCK:
        if not _tried:
            _tried = True
            from kvprof.kvcache.cuda_build import CudaOp

            source = Path(__file__).resolve().parent / "csrc" / "tensor_signature.cpp"
            module, error = CudaOp("kvprof_tensor_signature", [source], "the tensor signature helper",
                                   cuda=False).load()
            SIGNATURE = getattr(module, "signature", None) if error is None else None
            CALL_KEY = getattr(module, "call_key", None) if SIGNATURE is not None else None
            _why = error if SIGNATURE is None else None
            if SIGNATURE is None and _why is None:
                _why = "the tensor signature helper has no signature function"
            if CALL_KEY is None:
                SIGNATURE = None
                _why = _why or "the tensor signature helper has no call_key function"
    return _why


def ready(first: Any) -> bool:
    """Whether calls can be keyed (``CALL_KEY`` loaded), loading the helper at the first call
    whose first argument is a CUDA tensor: a CPU process loads it itself (``load``), so a CPU
    run never waits for a build."""
    if CALL_KEY is None and not _tried and getattr(first, "is_cuda", False):
        load()
    return CALL_KEY is not None


def state() -> str:
    """Whether calls are keyed by the C++ signature: 'on', 'not loaded yet' or why not."""
    if SIGNATURE is not None:
        return "on"
    return _why or "not loaded yet"


def keep(memo: dict[Any, Any], key: Any, value: Any) -> Any:
    """Store ``value`` under ``key`` in a bounded memo (cleared past ``MEMO_LIMIT``); returns it."""
    if len(memo) > MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


__all__ = ["CALL_KEY", "ENV_SIGNATURE", "MEMO_LIMIT", "SIGNATURE", "keep", "load", "ready", "state"]
