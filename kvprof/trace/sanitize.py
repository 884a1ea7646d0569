"""Type-check what a trace or manifest says about itself before the analysis trusts it.

A trace's ``kvprof`` metadata and a run's manifest are JSON anyone can edit: a ``layers``
that is a string, ``files`` that is a list, a ``device`` that is a number used to end in an
AttributeError deep in the analysis. Here each known key is kept only with the type the
analysis reads, and every key dropped is named in a warning (never a silent change).
Manifest file names must be plain names inside the run folder: a manifest cannot make
kvprof read ``../../elsewhere`` or an absolute path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

SPAN_WARN_NS = 86_400 * 10**9  # a profile longer than a day: a timestamp is probably corrupt


def _is_int(v: Any) -> bool:
    return v.__class__ is int and -(1 << 63) < v < (1 << 63)


def _is_number(v: Any) -> bool:
    return _is_int(v) or (v.__class__ is float and math.isfinite(v))


def _str_map(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x) for k, x in v.items())


_META_TYPES: dict[str, Callable[[Any], bool]] = {
    "variant": lambda v: isinstance(v, str) and bool(v),
    "fused": lambda v: isinstance(v, bool) or v is None,
    "run_id": lambda v: isinstance(v, str),
    "cache_dtype": lambda v: isinstance(v, str),
    "input_dtype": lambda v: isinstance(v, str),
    "device": lambda v: isinstance(v, dict),
    "model": lambda v: isinstance(v, dict),
    "layers": lambda v: isinstance(v, list) and bool(v) and all(_is_int(x) and 0 <= x < (1 << 31) for x in v),
    "bytes_per_token": _is_number,
    "phases": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "kernels_per_write": _str_map(lambda x: x is None or (_is_int(x) and x >= 0)),
    "template": _str_map(lambda x: isinstance(x, dict)),
    "paths": _str_map(lambda x: _is_int(x) and x >= 0),
}

_ENTRY_TYPES: dict[str, Callable[[Any], bool]] = {
    "available": lambda v: isinstance(v, bool),
    "reason": lambda v: v is None or isinstance(v, str),
    "description": lambda v: v is None or isinstance(v, str),
    "fused_claim": lambda v: v is None or isinstance(v, bool),
    "files": _str_map(lambda x: isinstance(x, str)),
    "paths": _str_map(lambda x: _is_int(x) and x >= 0),
    "bytes_per_token": _is_number,
    "kernels_per_write": _str_map(lambda x: x is None or (_is_int(x) and x >= 0)),
    "fused": lambda v: isinstance(v, dict),
}


def _clean(doc: dict[str, Any], types: dict[str, Callable[[Any], bool]], where: str) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in doc.items():
        check = types.get(key)
        if check is not None and not check(value):
            dropped.append(key)
            continue
        out[key] = value
    warnings = [f"{where}: ignored {', '.join(dropped)} (not of the type kvprof writes)"] if dropped else []
    return out, warnings


def clean_meta(meta: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[str]]:
    """A trace's kvprof metadata with ill-typed keys dropped, and a warning naming them."""
    if meta is None:
        return None, []
    return _clean(meta, _META_TYPES, "the trace's kvprof metadata")


def plain_name(name: str) -> bool:
    """A file name directly inside the run folder (no separator, no '..', not hidden)."""
    return bool(name) and "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")


def clean_manifest_entry(name: str, entry: Any) -> tuple[dict[str, Any], list[str]]:
    """One manifest variant entry, type-checked; file names outside the run folder are dropped."""
    if not isinstance(entry, dict):
        return {}, [f"manifest: variant {name!r} is not an object; ignored"]
    out, warnings = _clean(entry, _ENTRY_TYPES, f"manifest: variant {name!r}")
    files = out.get("files") or {}
    outside = [k for k, f in files.items() if not plain_name(f)]
    if outside:
        out["files"] = {k: f for k, f in files.items() if k not in outside}
        warnings.append(f"manifest: variant {name!r} names files outside the run folder ({', '.join(outside)}); "
                        "not read")
    return out, warnings


def clean_manifest(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Top-level manifest keys the analysis reads (``device`` must be an object)."""
    warnings = []
    if "device" in doc and not isinstance(doc["device"], dict):
        doc = {k: v for k, v in doc.items() if k != "device"}
        warnings.append("manifest: ignored device (not an object)")
    return doc, warnings


def reader_warnings(stats: dict[str, Any], negative: int, start_ns: np.ndarray, dur_ns: np.ndarray) -> list[str]:
    """What a reader changed or skipped, said once per trace."""
    out = []
    bad = int(stats.get("out_of_range", 0))
    if bad:
        out.append(f"{bad:,} events skipped: timestamp or duration not finite or beyond ±3e15 µs (corrupt values)")
    if negative:
        out.append(f"{negative:,} events have a negative duration (end before start); counted as 0 ns")
    if len(start_ns):
        span = int(np.max(start_ns + np.maximum(dur_ns, 0))) - int(np.min(start_ns))
        if span > SPAN_WARN_NS:
            out.append(f"the events span {span / 86_400e9:,.1f} days: a timestamp is probably corrupt, "
                       "and windows and gaps are measured across it")
    return out
