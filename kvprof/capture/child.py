"""The workload as a child process, for profilers that trace a whole process (Nsight Systems).

torch.profiler and nsys cannot both trace one process (CUPTI allows one subscriber), so
the nsys pass re-runs the same workload here, with the same config and seed. Warm-up
happens before ``cudaProfilerStart``; graph capture happens inside the capture range so
nsys records which NVTX write range each graph node was created in.

Usage (by ``capture``, not by hand): ``python -m kvprof.capture.child SPEC.json RESULT.json``
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import torch

from kvprof.capture.config import CaptureConfig
from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import make_context
from kvprof.capture.session import StepTimer
from kvprof.core.errors import KvprofError
from kvprof.core.interrupts import ctrl_c_raises_interrupted
from kvprof.core.timings import StepSamples
from kvprof.kvcache.devinfo import resolve_device
from kvprof.kvcache.layouts.registry import create_variant


def run_child(spec_path: Path, result_path: Path) -> int:
    spec = orjson.loads(spec_path.read_bytes())
    variant = spec["variant"]
    given = CaptureConfig.from_dict(spec["config"])
    device = resolve_device(given.device)
    config = given.resolved_for(device.type)  # the parent resolved them already; a hand-made spec too
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    writer = create_variant(config.layout_name(), variant, **config.writer_options.get(variant, {}))
    cudart = torch.cuda.cudart() if device.type == "cuda" else None
    context = make_context(config, device)
    with session_for(config, writer, device, context=context) as session:
        prepared = []
        for i, phase in enumerate(session.phases):
            p = session.prepare(phase, i)
            session.warm_up(p)
            prepared.append(p)
        if cudart is not None:
            cudart.cudaProfilerStart()
        try:
            for p in prepared:
                if p.spec.graph:
                    session.capture_graph(p)
            session.pool.path_counts.clear()  # capture and its warm-up are not measured writes
            timers = [StepTimer(device, p.spec.steps) for p in prepared]
            for p, timer in zip(prepared, timers):
                session.run_phase(p, timer=timer)
        finally:
            if cudart is not None:
                session.synchronize()
                cudart.cudaProfilerStop()
        paths = session.measured_paths(prepared)
        result = {"variant": variant, "paths": paths, "layers": session.layers,
                  "bytes_per_token": session.bytes_per_token(),
                  "phases": [p.spec.as_dict() for p in prepared],
                  # the steps timed inside the nsys pass, as the reference pass times them
                  "step_timings": [
                      StepSamples(variant=variant, pass_="nsys", phase=p.spec.phase, size=p.spec.size,
                                  mode=session.mode, graph=p.spec.graph, writes_per_step=len(session.layers),
                                  clock=t.clock, samples_ns=tuple(t.samples_ns())).to_json()
                      for p, t in zip(prepared, timers)]}
    result_path.write_bytes(orjson.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kvprof.capture.child SPEC.json RESULT.json", file=sys.stderr)
        return 2
    try:
        with ctrl_c_raises_interrupted():
            return run_child(Path(args[0]), Path(args[1]))
    except KvprofError as exc:
        print(f"kvprof child: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
