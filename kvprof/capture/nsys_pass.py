"""The Nsight Systems pass: each variant's workload re-run as a child under ``nsys profile``.

A separate pass, because torch.profiler and nsys cannot both trace one process. The
child runs with an allowlisted environment (a report stores the whole environment of
the process it traced). Failures are returned, not raised: the torch pass is kept.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

import kvprof
from kvprof.capture.plan import CapturePlan
from kvprof.core.errors import KvprofError, rendered
from kvprof.core.run import Manifest
from kvprof.core.rundir import RunDir
from kvprof.core.timings import StepSamples, StepTimings
from kvprof.tools.envsafe import child_environment, describe
from kvprof.tools.nsys import export_sqlite, nsys_version, run_nsys_pass

CHILD_TIMEOUT_S = 900


def run_nsys_passes(
    nsys: Path,
    plan: CapturePlan,
    runnable: Sequence[Any],
    run_dir: Path,
    manifest: Manifest,
    log: Callable[[str], None],
    timings: StepTimings | None = None,
    names: Callable[[str], str] = str,
) -> list[KvprofError]:
    """Each runnable variant's workload under ``nsys profile`` in a child process that resolves
    the plan's ``settings`` again; a failure is recorded (``names``: how it spells a setting)
    and returned, never raised."""
    problems: list[KvprofError] = []
    package_root = str(Path(kvprof.__file__).resolve().parent.parent)
    env = child_environment(pass_env=list(plan.pass_env), names=names)
    env["PYTHONPATH"] = package_root + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["KVPROF_CHILD"] = "1"
    manifest.nsys = {"path": str(nsys), "version": nsys_version(nsys), "child_environment": describe(env)}
    run = RunDir(run_dir)
    for p in runnable:
        entry = manifest.variants[p.name]
        spec, result = run.nsys_child_spec(p.name), run.nsys_child_result(p.name)
        spec.write_bytes(orjson.dumps({"config": dict(plan.settings), "variant": p.name,
                                       # how the child's one-line error spells a setting, as the parent would
                                       "names": {k: names(k) for k in plan.settings if k != "resolved"}}))
        base = run.nsys_base(p.name)
        argv = [sys.executable, "-m", "kvprof.capture.child", str(spec), str(result)]
        log(f"nsys pass: {p.name}")
        try:
            res = run_nsys_pass(nsys, base, argv, env=env, timeout=CHILD_TIMEOUT_S,
                                cuda_graph_trace=plan.nsys_graph_trace)
            entry.files["nsys_rep"] = res.report.name
            if res.log is not None:
                entry.files["nsys_log"] = res.log.name
            sqlite = run.nsys_sqlite(p.name)
            export_sqlite(nsys, res.report, sqlite, env=env)
            entry.files["nsys_sqlite"] = sqlite.name
            if result.exists():
                child = orjson.loads(result.read_bytes())
                entry.nsys_paths = child.get("paths", {})
                if timings is not None:
                    for rec in child.get(RunDir.TIMINGS_KEY) or []:
                        timings.add(StepSamples.from_json(rec))
        except KvprofError as exc:
            entry.nsys_error = rendered(exc, names)
            problems.append(exc)
            log(f"nsys pass for {p.name} failed: {entry.nsys_error}")
        finally:
            spec.unlink(missing_ok=True)
            result.unlink(missing_ok=True)
    return problems
