"""kvprof's one facade: open a run or a trace, analyze it, write the outputs, compare, capture.

Every entry point goes through here -- the CLI commands, capture's first summary, the
dashboard's loader, the lab scripts -- so load -> analyze -> write is wired once.
Importing this module costs nothing: each function imports its layer when called, and
only ``capture`` imports torch.

    import kvprof.api as kv
    run = kv.open_run("traces/my-run")
    result = kv.analyze(run)
    kv.write_outputs(run, result, run.input)
    print(result.summary.variants["triton_fused"].fused)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprof.core.errors import DeviceError, KvprofError, Setting, Words, rendered
from kvprof.core.run import Manifest
from kvprof.core.rundir import RunDir, read_summary as _read_summary
from kvprof.core.schema import DEFAULT_MAX_EVENTS
from kvprof.core.summary import Summary

if TYPE_CHECKING:
    from kvprof.analysis.compare import Benchmark
    from kvprof.analysis.gate import GateResult
    from kvprof.analysis.runs import RunComparison
    from kvprof.analysis.summary import Analysis
    from kvprof.capture.config import CaptureConfig
    from kvprof.core.readers import ReaderRegistry
    from kvprof.core.verify import PdlResult, VerifyResult
    from kvprof.tools.background import BackgroundServer
    from kvprof.trace.load import Loaded


def open_run(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> Loaded:
    """A run directory, a folder of traces or one trace file, read and attributed."""
    from kvprof.trace.load import load as _load

    return _load(path, max_events)


load = open_run


def prefetch_trace(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> bool:
    """Start reading a Kineto trace file in a background thread, for a later ``open_run`` of it
    (kvprof.trace.kineto_io.prefetch): the read overlaps the imports that come before it.
    Folders and other formats are not read ahead. True when a read was started."""
    from kvprof.trace.kineto_io import prefetch

    return prefetch(path, max_events)


def trace_readers() -> ReaderRegistry:
    """The trace-reader registry, kvprof's own readers in it (importing kvprof.trace registers them),
    then any plugin's: what a trace may be named, which reader a file is."""
    import kvprof.trace  # noqa: F401 - registers the built-in readers into the registry
    from kvprof.core.readers import REGISTRY

    return REGISTRY


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    return RunDir(Path(run_dir)).read_manifest()


def read_summary(path: str | os.PathLike[str]) -> Summary:
    """A summary.json written by ``write_outputs`` (a folder: its summary.json)."""
    p = Path(path)
    return RunDir(p).read_summary() if p.is_dir() else _read_summary(p)


def benchmark(layers: int | None = None, itl_before_ms: float | None = None,
              itl_after_ms: float | None = None) -> Benchmark:
    """The serving benchmark the projection is held against, with any figure overridden."""
    from kvprof.analysis.compare import Benchmark

    b = Benchmark()
    return Benchmark(itl_before_ms=itl_before_ms or b.itl_before_ms, itl_after_ms=itl_after_ms or b.itl_after_ms,
                     layers=layers or b.layers)


def check_write_kernel_regex(regex: str | None) -> None:
    """UsageError for a write-kernel pattern that does not compile (none given: nothing to check,
    and nothing imported: the analysis module brings pandas, which analyze imports while its trace
    is read ahead)."""
    if regex is None:
        return
    from kvprof.analysis.write_kernels import patterns_with

    patterns_with(regex)


def analyze(loaded: Loaded, baseline: str | None = None, bench: Benchmark | None = None,
            layers: int | None = None, write_kernels: bool = False,
            write_kernel_regex: str | None = None, names: Callable[[str], str] = str) -> Analysis:
    """kvprof's one analysis; ``write_kernels``: also classify KV-write kernels by name
    (``write_kernel_regex`` adds a user pattern; a bad one is refused before any work; the
    summary records where it came from as ``names`` spells the setting: default its field, the
    command line passes its flags)."""
    from kvprof.analysis.jsonsafe import clean
    from kvprof.analysis.summary import analyze as _analyze

    if write_kernels:
        check_write_kernel_regex(write_kernel_regex)
    result = _analyze(loaded, baseline=baseline, bench=bench or benchmark(layers), layers=layers)
    if write_kernels:
        from kvprof.analysis.write_kernels import agree_replay_warnings, write_kernel_summary

        result.summary.write_kernels = clean(write_kernel_summary(loaded, write_kernel_regex, result.writes,
                                                                  names))
        # attribution's "graph replays ... not tied to writes" said again with what the steps tie
        result.summary.warnings = agree_replay_warnings(result.summary.warnings, result.summary.write_kernels)
    return result


def write_outputs(loaded: Loaded, result: Analysis, out: str | os.PathLike[str], scrub: bool = False) -> list[Path]:
    """summary.json, summary.csv, events.parquet, writes.parquet into ``out``, as one atomic set.
    ``scrub``: the scrub rules on every string first."""
    from kvprof.report.files import write_analysis

    rules = None
    if scrub:
        from kvprof.tools.scrub import Rules

        rules = Rules()
    return write_analysis(loaded, result, Path(out), rules)


def check_perfetto_output(path: str | os.PathLike[str]) -> None:
    """UsageError for a --perfetto path whose folder does not exist, ToolError without the package."""
    from kvprof.core.errors import UsageError
    from kvprof.report.perfetto import require_perfetto

    folder = Path(path).parent
    if not folder.is_dir():
        raise UsageError(Setting("perfetto"), f" {path}: no such folder {folder}")
    require_perfetto()


def write_perfetto(loaded: Loaded, result: Analysis, path: str | os.PathLike[str]) -> Path:
    """The run as a Perfetto trace (its GPU work, kvprof's writes, verdicts, steps and reference
    timings as tracks; docs/formats.md), written atomically; needs the ``perfetto`` package."""
    from kvprof.report.perfetto import write_perfetto as _write

    return _write(loaded, result, path)


def output_dir(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Where a command writes for ``path``: ``out``, else the folder, else the file's folder."""
    if out is not None:
        return Path(out)
    p = Path(path)
    return p if p.is_dir() else p.parent


def check_no_other_analysis(path: str | os.PathLike[str], out: str | os.PathLike[str], force: bool = False) -> None:
    """Before any work: OutputError where ``out`` already holds analyze's outputs of another input
    (``analyze a.json`` then ``analyze b.json`` in one folder would replace the first's silently).
    The same input analysed again (another baseline, a newer kvprof) replaces its own outputs;
    ``force`` replaces another's. An unreadable summary.json is left to the writer's own checks."""
    from kvprof.core.errors import KvprofError, OutputError
    from kvprof.core.rundir import RunDir

    run = RunDir(Path(out))
    if force or not run.summary.is_file():
        return
    try:
        summary = run.read_summary()
    except KvprofError:
        return
    previous = summary.input
    folder = Path(path).is_dir() and summary.input_kind in ("run", "dir")
    if not previous or _same_input(Path(previous), Path(path)) or (folder and _same_input(Path(out), Path(path))):
        return  # the same input, or the folder's own analysis (the folder since renamed or moved)
    raise OutputError(f"{run.summary} holds the analysis of {Path(previous).name}, not of {Path(path).name}: ",
                      Setting("out"), " FOLDER to write this one's elsewhere, or ", Setting("force"), " to replace it")


def _same_input(previous: Path, current: Path) -> bool:
    """Whether a summary's recorded input is ``current``: the same file or folder, or (a path
    recorded relative to another folder, or scrubbed) the same name."""
    try:
        if previous.resolve() == current.resolve():
            return True
    except OSError:
        pass
    return previous.name == current.resolve().name


def compare_variants(result: Analysis, baseline: str, bench: Benchmark | None = None,
                     layers: int | None = None, extra: Analysis | None = None) -> dict[str, Any]:
    """Variants against ``baseline`` within one analysis (``extra``: another run's variants too,
    against this run's baseline). The document compare.json holds."""
    import pandas as pd

    from kvprof.analysis.compare import compare_groups
    from kvprof.analysis.jsonsafe import clean
    from kvprof.core.errors import UsageError

    groups = result.groups
    present = sorted(set(groups["variant"].astype(str))) if len(groups) else []
    if baseline not in present:
        raise UsageError(f"baseline {baseline!r} has no measured writes in {result.summary.input} "
                         f"(variants: {', '.join(present) or 'none'})")
    fused = result.summary.fused_variants
    if extra is not None:
        others = extra.groups[extra.groups["variant"].astype(str) != baseline]
        groups = pd.concat([groups[groups["variant"].astype(str) == baseline], others], ignore_index=True)
        fused += extra.summary.fused_variants
    doc = clean(compare_groups(groups, baseline, bench or benchmark(layers), layers, prefer=fused,
                               source_order=result.summary.trusted_sources))
    verdicts = {**result.summary.variants, **(extra.summary.variants if extra is not None else {})}
    doc["interpreted"] = sorted(n for n, v in verdicts.items() if v.interpreted)  # marked * by every view
    return doc


def compare_runs(before: Analysis, after: Analysis, pairs: list[tuple[str, str]] | None = None,
                 bench: Benchmark | None = None, layers: int | None = None) -> RunComparison:
    """Each variant of ``before`` against the same variant of ``after`` (or the given pairs)."""
    from kvprof.analysis.runs import compare_runs as _compare_runs

    return _compare_runs(before.groups, after.groups, pairs, bench or benchmark(layers), layers)


def regression_gate(base: Analysis, new: Analysis, threshold_pct: float, *, base_run: Loaded | None = None,
                    new_run: Loaded | None = None, include_interpreted: bool = False,
                    check_control: bool = True, names: Callable[[str], str] = str) -> GateResult:
    """Each variant x phase x size of ``new`` against ``base`` on the most trusted source both
    measured (``base``'s trusted_sources), once the runs are comparable: regressed when slower
    by more than ``threshold_pct`` percent beyond the noise (kvprof.analysis.gate). ``base_run``/
    ``new_run``: the opened runs, for their per-step samples and manifests. ``check_control=False``
    only to measure what an unchecked control lets through (lab/gate_false_fails.py). ``names``:
    how the result spells a setting it names (default its field; the command line passes its flags)."""
    from kvprof.analysis.gate import GateRun, regression_gate as _gate

    def side(result: Analysis, loaded: Loaded | None) -> GateRun:
        return GateRun(groups=result.groups, summary=result.summary,
                       timings=loaded.timings if loaded is not None else None,
                       manifest=loaded.manifest if loaded is not None else None)

    return _gate(side(base, base_run), side(new, new_run), threshold_pct,
                 source_order=base.summary.trusted_sources, include_interpreted=include_interpreted,
                 check_control=check_control, names=names)


def comparability(before: Analysis, after: Analysis, before_run: Loaded | None = None,
                  after_run: Loaded | None = None) -> tuple[list[str], list[str]]:
    """Why two runs cannot be compared (device, timing source, settings, interpreter, threads,
    layers), one line each, and what could not be checked (kvprof.analysis.gate.comparability)."""
    from kvprof.analysis.gate import GateRun, comparability as _comparability

    def side(result: Analysis, loaded: Loaded | None) -> GateRun:
        return GateRun(groups=result.groups, summary=result.summary,
                       timings=loaded.timings if loaded is not None else None,
                       manifest=loaded.manifest if loaded is not None else None)

    return _comparability(side(before, before_run), side(after, after_run))


def clean(doc: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python values."""
    from kvprof.analysis.jsonsafe import clean as _clean

    return _clean(doc)


@dataclass
class CaptureResult:
    """A capture, opened and analysed: the run, what failed but was kept, and the first summary."""

    run_dir: Path
    manifest: Manifest
    problems: list[KvprofError] = field(default_factory=list)  # kept-but-failed parts (nsys, scrub check, HTA)
    summary: Summary | None = None  # the analysis of the run, as `analyze` makes it
    analysis_error: str | None = None


def capture(config: CaptureConfig, *, progress_factory: Callable[[int], Any] | None = None,
            analyse: bool = True, render: bool = False, log: Callable[[str], None] | None = None,
            names: Callable[[str], str] = str) -> CaptureResult:
    """Capture, then open, analyse and write the outputs into the run, as ``analyze`` would
    (``analyse``), prove a scrubbed run clean, make its ``hta/<variant>/`` folders
    (:func:`hta_folders`) and, with ``render``, print the first summary. Capture itself only
    writes the run (imports torch); a failure after it is one of the result's problems (or its
    ``analysis_error``), and the run stays. ``log`` (default: stderr) gets what the capture says
    as it goes; ``names`` spells the settings that it and the run's records name (default:
    their field names; the command line passes its flags)."""
    from kvprof.capture.plan import resolve
    from kvprof.capture.run import capture as _capture

    plan = resolve(config)  # the one resolution: capture and everything below it read this plan
    captured = _capture(plan, progress_factory=progress_factory, names=names, read_events=trace_events,
                        **({"log": log} if log is not None else {}))
    result = CaptureResult(captured.run_dir, captured.manifest, list(captured.problems),
                           analysis_error=Words("not analysed (", Setting("summary"), ")"))
    try:
        return _after_capture(plan.shape.layers, plan.scrub, result, analyse, render, names)
    except KeyboardInterrupt as exc:  # the run is in place: say what it holds and what did not run
        run = str(result.run_dir)
        left = [w for w, done in ((Words(f"its analysis (kvprof analyze {run})"),
                                   not analyse or result.summary is not None),
                                  (Words("its scrub check (kvprof scrub ", Setting("check"), f" {run})"),
                                   not plan.scrub)) if not done]
        exc.kept = Words(f"the run {run} was captured whole and is kept",  # type: ignore[attr-defined]
                         *(["; not done: ", *_joined(left)] if left else []))
        raise


def _joined(parts: list[Words]) -> list[object]:
    return [x for i, w in enumerate(parts) for x in ((", ", w) if i else (w,))]


def trace_events(path: Path) -> Any:
    """A Kineto trace's event table with its writes attributed: what capture cuts a step's
    template from (handed to it, since the trace readers sit above capture)."""
    from kvprof.trace.attribution import attribute
    from kvprof.trace.kineto import read_kineto
    from kvprof.trace.table import to_frame

    return to_frame(attribute(read_kineto(Path(path))).events)


def _after_capture(layers: int, scrub: bool, result: CaptureResult, analyse: bool, render: bool,
                   names: Callable[[str], str] = str) -> CaptureResult:
    """What api.capture does once the run folder is in place (its outputs are each atomic);
    ``layers``: the model's, for the projections; ``scrub``: whether the run was scrubbed."""
    if analyse:  # the run is complete and in place; the outputs are added as one atomic set
        try:
            loaded = open_run(result.run_dir)
            analysis = analyze(loaded, bench=benchmark(layers), layers=layers)
            write_outputs(loaded, analysis, result.run_dir, scrub=scrub)
            result.summary, result.analysis_error = analysis.summary, None
        except KvprofError as exc:
            result.analysis_error = exc.words or str(exc)
    if scrub:  # after the last file: prove what was written is clean
        result.problems += _scrub_check(result.run_dir)
    try:
        hta_folders(result.run_dir)
    except KvprofError as exc:
        result.problems.append(exc)
    if render:
        render_capture(result, names)
    return result


def verify(variants: Sequence[str] | None = None, layouts: Sequence[str] | None = None, *, device: str = "auto",
           budget_s: float = 40.0, cases: int = 200, seed: int = 0, case: int | None = None,
           started: float | None = None, names: Callable[[str], str] = str) -> VerifyResult:
    """Differential testing of writers against their layout's reference (``kvprof.verify``):
    ``variants`` registered names or ``module:function`` specs (None: every registered writer
    that runs on ``device``), at most ``cases`` each, until ``budget_s`` seconds have passed;
    ``case``: only that case of each; ``started``: the ``time.perf_counter()`` the budget counts
    from (default: now); ``names``: how a failing case's rerun command spells these settings
    (default their names here; the command line passes its flags). On a CPU the Triton writers
    run in Triton's interpreter (set here when the environment does not say, before any writer
    is imported)."""
    from kvprof.kvcache.devinfo import resolve_device, triton_interpreter

    dev = resolve_device(device)
    interpreted = dev.type == "cpu" and triton_interpreter(dev) is not None
    from kvprof.verify import verify as _verify

    return _verify(variants, layouts, device=dev, budget_s=budget_s, cases=cases, seed=seed, case=case,
                   interpreted=interpreted, started=started, names=names)


def verify_pdl(variants: Sequence[str] | None = None, layouts: Sequence[str] | None = None, *,
               device: str = "auto", trials: int = 256, tokens: Sequence[int] = (1, 7, 64, 512, 4096),
               seed: int = 0) -> PdlResult:
    """PDL visibility (``kvprof.verify_pdl``): stale rows read by a kernel launched with PDL
    right after each write, past its ``griddepcontrol.wait``; CUDA sm_90+ only (a one-line
    ``DeviceError`` elsewhere)."""
    from kvprof.kvcache.devinfo import resolve_device

    dev = resolve_device(device)
    from kvprof.verify_pdl import pdl_refusal

    why = pdl_refusal(dev)
    if why is not None:
        raise DeviceError(why)
    from kvprof.verify_pdl import verify_pdl as _verify_pdl

    return _verify_pdl(variants, layouts, device=dev, trials=trials, tokens=tokens, seed=seed)


def _scrub_check(run_dir: Path) -> list[KvprofError]:
    """``scrub --check`` of a finished run folder: one error per file where anything remains."""
    from kvprof.tools.scrub import check_path

    problems: list[KvprofError] = []
    for report in check_path(run_dir, on_error=problems.append):
        if not report.clean:
            problems.append(KvprofError(f"scrub check: {report.line()}"))
    return problems


def render_capture(result: CaptureResult, names: Callable[[str], str] = str) -> None:
    """What ran, the compact table, the verdict, and where the full tables are (or why there is no summary;
    ``names`` spells the settings it names)."""
    from kvprof.report.console import make_console
    from kvprof.report.verdict import render_first_run

    console = make_console()
    if result.summary is None:
        console.print(f"[yellow]analysis of the capture failed: {rendered(result.analysis_error, names)}[/] "
                      f"(run `kvprof analyze {result.run_dir}`)")
        return
    render_first_run(result.summary, console, result.manifest, str(result.run_dir), names)


def hta_folders(run_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """``RUN/hta/<variant>/``: each variant's torch.profiler trace (one per rank) alone in a
    folder, as HolisticTraceAnalysis reads one (every .json/.gz in it, one trace per rank):
    ``TraceAnalysis(trace_dir=kv.hta_folders(run)["index_put"])``. Hard links, copies where
    the file system has none; made again whole on every call (runs from older captures)."""
    from kvprof.trace.hta import write_hta_folders

    return write_hta_folders(Path(run_dir))


def dashboard_server(run_dir: str | os.PathLike[str] | None = None, *, port: int | None = None,
                     options: Sequence[str] = (), env: Mapping[str, str] | None = None,
                     cwd: str | os.PathLike[str] | None = None, log: Path | None = None) -> BackgroundServer:
    """``kvprof dashboard [RUN_DIR] --port PORT [options]`` as a background process, for scripts and
    notebooks: ``with kv.dashboard_server(run).running() as url: ...`` (a free port by default;
    the server is stopped when the block ends)."""
    import sys

    from kvprof.tools.background import BackgroundServer, free_port

    port = free_port() if port is None else port
    command = [sys.executable, "-m", "kvprof", "dashboard", *([os.fspath(run_dir)] if run_dir is not None else []),
               "--port", str(port), *options]
    return BackgroundServer(command, port, env=env, cwd=cwd, log=log)


__all__ = ["DEFAULT_MAX_EVENTS", "CaptureResult", "RunDir", "analyze", "benchmark", "capture",
           "check_no_other_analysis", "check_write_kernel_regex", "clean", "comparability", "compare_runs",
           "compare_variants", "dashboard_server", "hta_folders", "load", "open_run", "output_dir", "prefetch_trace",
           "read_manifest", "read_summary",
           "regression_gate", "trace_readers", "render_capture", "write_outputs"]
