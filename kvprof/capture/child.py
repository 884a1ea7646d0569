"""The workload as a child process, for profilers that trace a whole process (Nsight Systems).

torch.profiler and nsys cannot both trace one process (CUPTI allows one subscriber), so
the nsys pass re-runs the same workload here, with the same config and seed. Warm-up
happens before ``cudaProfilerStart``; graph capture happens inside the capture range so
nsys records which NVTX write range each graph node was created in.

Usage (by ``capture``, not by hand): ``python -m kvprof.capture.child SPEC.json RESULT.json``
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import torch

from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import make_context, resolve_settings
from kvprof.capture.session import StepTimer
from kvprof.core.errors import KvprofError, rendered
from kvprof.core.interrupts import ctrl_c_raises_interrupted
from kvprof.core.rundir import RunDir
from kvprof.core.timings import StepSamples
from kvprof.kvcache.layouts.registry import create_variant


def run_child(spec_path: Path, result_path: Path) -> int:
    spec = orjson.loads(spec_path.read_bytes())
    variant = spec["variant"]
    plan = resolve_settings(spec["config"])  # the parent's plan again (a hand-made spec resolves alike)
    device = plan.device
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    writer = create_variant(plan.layout, variant, **plan.writer_options.get(variant, {}))
    cudart = torch.cuda.cudart() if device.type == "cuda" else None
    context = make_context(plan)
    with session_for(plan, writer, device, context=context) as session:
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
                  RunDir.TIMINGS_KEY: [
                      StepSamples(variant=variant, pass_="nsys", phase=p.spec.phase, size=p.spec.size,
                                  mode=session.mode, graph=p.spec.graph, writes_per_step=len(session.layers),
                                  clock=t.clock, samples_ns=tuple(t.samples_ns())).to_json()
                      for p, t in zip(prepared, timers)]}
    result_path.write_bytes(orjson.dumps(result))
    return 0


def _names(spec_path: Path) -> Callable[[str], str]:
    """How the parent spells a setting (the spec's ``names``: the command line's flags), so that
    the child's one line reads as the parent's would; a field as it is where the spec has none."""
    try:
        names = orjson.loads(spec_path.read_bytes()).get("names")
    except (OSError, ValueError, AttributeError):
        names = None
    table: dict[str, str] = names if isinstance(names, dict) else {}
    return lambda field: str(table.get(field, field))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kvprof.capture.child SPEC.json RESULT.json", file=sys.stderr)
        return 2
    try:
        with ctrl_c_raises_interrupted():
            return run_child(Path(args[0]), Path(args[1]))
    except KvprofError as exc:
        print(f"kvprof child: {rendered(exc, _names(Path(args[0])))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
