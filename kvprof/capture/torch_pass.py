"""The torch.profiler pass: one gzipped Chrome trace per variant, self-describing.

The trace carries a top-level ``kvprof`` key (variant, layer order, bytes per token,
kernels per write from an eager template, the paths the writer reported) so that it can
be analysed without its run directory, and ``distributedInfo`` so that
HolisticTraceAnalysis loads it.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import torch
from torch.profiler import ProfilerActivity, profile

from kvprof.capture.session import PreparedPhase, VariantSession
from kvprof.trace.hta import hta_metadata_json


def _activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def _experimental() -> Any:
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, TypeError):  # older torch: no sync events, everything else still works
        return None


def kernels_per_write(session: VariantSession, prepared: PreparedPhase) -> dict[str, int | None]:
    """Kernels, memcpys and memsets one eager write launches, counted in a throwaway trace.

    Graph replays carry no per-write ranges, so the analysis splits a replay's kernels by
    this count; it is measured, not assumed from the writer's claim.
    """
    if session.device.type != "cuda":
        return {"kernels": None, "memcpy": None, "memset": None}
    loc = prepared.locs[0]
    with profile(activities=_activities(session.device)) as prof:
        session.write_step(loc, prepared.k, prepared.v)
        session.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "template.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            events = orjson.loads(f.read()).get("traceEvents", [])
    counts = {"kernel": 0, "gpu_memcpy": 0, "gpu_memset": 0}
    for e in events:
        cat = e.get("cat")
        if cat in counts and e.get("ph") == "X":
            counts[cat] += 1
    layers = len(session.layers)
    out: dict[str, int | None] = {}
    for key, name in (("kernel", "kernels"), ("gpu_memcpy", "memcpy"), ("gpu_memset", "memset")):
        out[name] = counts[key] // layers if counts[key] % layers == 0 else None
    return out


def run_torch_pass(
    session: VariantSession,
    out_dir: Path,
    metadata: dict[str, Any],
    on_step: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Warm up, capture graphs, then profile every phase; write ``<variant>.pt.trace.json.gz``."""
    prepared: list[PreparedPhase] = []
    templates: dict[str, dict[str, int | None]] = {}
    for i, spec in enumerate(session.phases):
        p = session.prepare(spec, i)
        session.warm_up(p)
        templates[f"{spec.phase} {spec.size}"] = kernels_per_write(session, p)
        if spec.graph:
            session.capture_graph(p)
        prepared.append(p)
    session.pool.path_counts.clear()  # from here on: only the measured steps
    with profile(activities=_activities(session.device), experimental_config=_experimental()) as prof:
        for p in prepared:
            session.run_phase(p, on_step)
        paths = session.measured_paths(prepared)
        meta = {
            **metadata,
            "layers": session.layers,
            "bytes_per_token": session.bytes_per_token(),
            "phases": [p.spec.as_dict() for p in prepared],
            # keyed "<phase> <size>", e.g. "decode 10"
            "kernels_per_write": {k: v["kernels"] for k, v in templates.items()},
            "template": templates,
            "paths": paths,
        }
        # metadata must be added while the profiler is still recording
        prof.add_metadata_json("kvprof", orjson.dumps(meta).decode())
        prof.add_metadata_json("distributedInfo", hta_metadata_json(rank=0))  # HolisticTraceAnalysis reads the rank here
    name = f"{session.writer.name}.pt.trace.json.gz"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_dir / name, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    del prepared
    return {"torch_trace": name, "paths": paths, "bytes_per_token": meta["bytes_per_token"], "kernels_per_write": meta["kernels_per_write"], "template": templates}

