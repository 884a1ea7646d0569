"""The regression gate: is any (variant, phase, size) of NEW slower than in BASE?

``kvprof compare BASE NEW --fail-if-slower PCT`` asks this for CI. First the two runs must
be comparable (``comparability``: device, timing source, settings, Triton's interpreter,
torch threads, layers per step); if they are not, nothing is judged and each reason is
one line. Then each variant is paired with itself. Per (variant, phase, size) one source
is judged: the first, in BASE's ``trusted_sources`` order (the unprofiled reference first
where the run has one, then the least perturbed profiler), that both runs measured. The
figure is ``cost_per_write_ns`` (what a write costs the step, the figure analyze reports).

A row regresses when NEW is slower than BASE by more than PCT percent beyond the noise:

- where both runs' reference passes timed a control series beside their steps (a CPU: the
  step's K and V stored by torch's own index_put into a scratch tensor, the machine's speed
  at that moment), on each step's cost over the control step timed next to it: the change
  of the median of those ratios and the low end of its 95 % bootstrap interval are both
  above PCT. A process that the machine runs slower as a whole (seen: 1.7-2x on a shared
  2-core machine), or a burst of load on a few steps, slows the control alike and is not a
  regression; slower code is;
- with per-step samples and no control (a GPU's CUDA events): the low end of the 95 %
  bootstrap interval of NEW's median cost per write minus BASE's is above PCT % of BASE's
  cost, and so it is in the step timings of a profiled pass both runs made (the same
  writes timed at another moment of each run);
- without samples, from the groups' step IQRs: slower by more than PCT % and by more than
  the sum of both runs' step IQRs per write;
- with neither (fewer than 4 steps) the noise is unknown and the row is not judged.

Rows of a variant whose Triton kernel ran under Triton's interpreter (the interpreter's
time in numpy, which swung by a factor of 3 between identical runs) are left out unless
``include_interpreted``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.numbers import finite_or_none
from kvprof.core.run import Manifest
from kvprof.core.summary import Summary
from kvprof.core.timings import CONTROL, StepSamples, StepTimings

FALLBACK_ORDER = ("reference", "nsys", "kineto")
CONFIDENCE = 0.95
RESAMPLES = 4000
MIN_SAMPLES = 4  # as for an IQR: fewer steps say nothing of a run's scatter
SEED = 0  # the same two runs always get the same verdict
# manifest config keys whose difference makes two runs measure different things
SETTINGS = ("cache_dtype", "input_dtype", "layout", "engine", "context", "context_len", "slots", "page_size",
            "loc_dtype", "k_scale", "v_scale", "seed", "cuda_graph", "torch_sync_events", "warmup")
RESOLVED = ("cache_dtype", "input_dtype", "layout")  # read from config.resolved where the manifest has it


@dataclass(frozen=True)
class GateRun:
    """One side of the gate: what analyze made of a run, with its step samples and manifest."""

    groups: pd.DataFrame
    summary: Summary | None = None
    timings: StepTimings | None = None
    manifest: Manifest | None = None


@dataclass
class GateRow:
    """One (variant, phase, size) judged on one source; times in ns per write.

    ``judged_pct`` is the slowdown the verdict is on, ``low_pct``/``high_pct`` its 95 % interval:
    ``noise`` "control" (per-step samples and both runs' control series: the cost over the
    machine's speed; ``drift_pct``: how much slower NEW's machine ran the control), "bootstrap"
    (per-step samples; ``confirmed_in``: the profiled pass held to the same rule) or "iqr"
    (``spread_ns``: both runs' step IQRs per write; the interval is the slowdown +- it).
    """

    variant: str
    phase: str
    size: int
    source: str
    base_ns: float
    new_ns: float
    slower_pct: float
    drift_pct: float | None
    judged_pct: float
    noise: str
    low_pct: float | None
    high_pct: float | None
    confirmed_in: str | None
    confirm_low_pct: float | None
    base_iqr_ns: float | None
    new_iqr_ns: float | None
    spread_ns: float | None
    regressed: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GateResult:
    """Every judged row, why a point was not judged, what was left out, and why the runs cannot
    be compared (then nothing is judged)."""

    threshold_pct: float
    rows: list[GateRow] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # interpreted rows, unless include_interpreted
    not_comparable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be checked

    @property
    def regressed(self) -> list[GateRow]:
        return [r for r in self.rows if r.regressed]

    @property
    def comparable(self) -> bool:
        return not self.not_comparable

    @property
    def passed(self) -> bool:
        return self.comparable and bool(self.rows) and not self.regressed

    def to_json(self) -> dict[str, Any]:
        return {"threshold_pct": self.threshold_pct, "passed": self.passed, "comparable": self.comparable,
                "rule": RULE, "rows": [r.to_json() for r in self.rows], "unjudged": self.unjudged,
                "left_out": self.left_out, "not_comparable": self.not_comparable, "notes": self.notes}


RULE = ("slower than BASE by more than threshold_pct beyond the noise: judged_pct and low_pct, the low end of its "
        "95 % bootstrap interval, above threshold_pct; noise control: the cost per write over the control series "
        "(each step over the machine's speed timed beside it); noise bootstrap: the median difference per write, also "
        "in a profiled pass both runs timed (confirm_low_pct); noise iqr: slower by more than threshold_pct and by "
        "more than spread_ns (both runs' step IQR per write); rows of unknown noise are not judged")


# -- comparability ---------------------------------------------------------------------------

def _device(run: GateRun) -> tuple[str | None, str | None]:
    """(type, name) of the run's device: the manifest's, else what analyze found in the traces."""
    d = run.manifest.device if run.manifest is not None else (run.summary.device if run.summary else {})
    if not isinstance(d, dict):
        return None, None
    kind, name = d.get("type"), d.get("name")
    return (str(kind) if kind else None), (str(name) if name else None)


def _clock(run: GateRun) -> str | None:
    if run.summary is None:
        return None
    t = run.summary.timing("reference")
    return t.how if t.clock is not None else None


def _setting(m: Manifest, key: str) -> Any:
    if key in RESOLVED:
        resolved = m.config.get("resolved")
        if isinstance(resolved, dict) and key in resolved:
            return resolved[key]
    return m.config.get(key)


def comparability(base: GateRun, new: GateRun) -> tuple[list[str], list[str]]:
    """(why the runs cannot be compared, one line each; what could not be checked)."""
    why: list[str] = []
    notes: list[str] = []
    (tb, nb), (tn, nn) = _device(base), _device(new)
    if (nb and nn and nb != nn) or (tb and tn and tb != tn):
        why.append(f"device: BASE ran on {' '.join(x for x in (tb, nb) if x)}, NEW on "
                   f"{' '.join(x for x in (tn, nn) if x)}")
    cb, cn = _clock(base), _clock(new)
    if (cb is None) != (cn is None):
        has, lacks = ("BASE", "NEW") if cb else ("NEW", "BASE")
        why.append(f"source: {has} has the unprofiled reference pass, {lacks} does not (its figures would be a "
                   "profiler's)")
    elif cb and cn and cb != cn:
        why.append(f"source: BASE's reference pass was timed with {cb}, NEW's with {cn}")
    mb, mn = base.manifest, new.manifest
    if mb is None or mn is None:
        lacking = " and ".join(n for n, m in (("BASE", mb), ("NEW", mn)) if m is None)
        notes.append(f"settings not checked: {lacking} {'has' if ' and ' not in lacking else 'have'} no manifest "
                     "(a trace, not a run directory)")
        return why, notes
    why += _model_differs(mb, mn) + _settings_differ(mb, mn)
    return why, notes


def _model_differs(mb: Manifest, mn: Manifest) -> list[str]:
    """The model shape (each dimension that differs), else the model name and tp as given."""
    why: list[str] = []
    sb, sn = ((m.config.get("resolved") or {}).get("shape") for m in (mb, mn))
    if isinstance(sb, dict) and isinstance(sn, dict):
        keys = [k for k in dict.fromkeys([*sb, *sn]) if sb.get(k) != sn.get(k)]
        if keys:
            why.append("settings: model shape " + ", ".join(f"{k} {_show(sb.get(k))} in BASE, {_show(sn.get(k))} "
                                                            "in NEW" for k in keys))
    else:
        for key in ("model", "tp"):
            if mb.config.get(key) != mn.config.get(key):
                why.append(f"settings: {key} is {_show(mb.config.get(key))} in BASE, {_show(mn.config.get(key))} "
                           "in NEW")
    return why


def _settings_differ(mb: Manifest, mn: Manifest) -> list[str]:
    """The capture settings, ranks, interpreter, threads and layers that differ, one line each."""
    why: list[str] = []
    for key in SETTINGS:
        if key == "context_len" and _setting(mb, "context") != "layer":
            continue  # only a decoder-layer step reads it
        vb, vn = _setting(mb, key), _setting(mn, key)
        if vb != vn:
            why.append(f"settings: {key} is {_show(vb)} in BASE, {_show(vn)} in NEW")
    if mb.world_size != mn.world_size:
        why.append(f"settings: {mb.world_size or 1} rank(s) in BASE, {mn.world_size or 1} in NEW")
    for name in sorted(set(mb.variants) & set(mn.variants)):
        ib, i_n = mb.variants[name].interpreted, mn.variants[name].interpreted
        if ib != i_n:
            how = {True: "under Triton's interpreter", False: "compiled"}
            why.append(f"interpreter: {name} ran {how[ib]} in BASE, {how[i_n]} in NEW")
    tb, tn = mb.config.get("threads"), mn.config.get("threads")
    if tb != tn:
        why.append(f"torch threads: {_show(tb)} in BASE, {_show(tn)} in NEW")
    lb, ln = mb.config.get("layers"), mn.config.get("layers")
    if lb != ln:
        why.append(f"layers: each step wrote {_show(lb)} layer(s) in BASE, {_show(ln)} in NEW")
    return why


def _show(v: Any) -> str:
    return "not set" if v is None else str(v)


# -- noise -----------------------------------------------------------------------------------

def _iqr_per_write(row: Any) -> float | None:
    """The step IQR divided by the writes per step (the spread of a per-write figure)."""
    iqr, writes, steps = (finite_or_none(row.get(k)) for k in ("step_iqr_ns", "writes", "steps"))
    if iqr is None or not writes or not steps:
        return None
    return iqr * steps / writes


def _series(timings: StepTimings | None, pass_: str, variant: str, phase: str,
            size: int) -> dict[str, StepSamples]:
    if timings is None:
        return {}
    return {r.mode: r for r in timings.select(pass_=pass_)
            if (r.variant, r.phase, r.size) == (variant, phase, size) and len(r.samples_ns) >= MIN_SAMPLES}


def _per_step_over_control(modes: dict[str, StepSamples]) -> np.ndarray | None:
    """Each step's cost over the control step timed beside it (as kvprof.analysis.reference
    computes the cost: the step, or inside a decoder layer the layer minus the layer without
    the write); None without a control of the same length."""
    main, control = modes.get("layer") or modes.get("writes"), modes.get(CONTROL)
    if main is None or control is None or len(control.samples_ns) != len(main.samples_ns):
        return None
    x = np.asarray(main.samples_ns, dtype=float)
    bare = modes.get("layer_no_write")
    if main.mode == "layer":
        if bare is None or len(bare.samples_ns) != len(x):
            return None
        x = x - np.asarray(bare.samples_ns, dtype=float)
    c = np.asarray(control.samples_ns, dtype=float)
    return x / c if bool((c > 0).all()) else None


def _draws(modes: dict[str, StepSamples], rng: np.random.Generator,
           controlled: bool) -> np.ndarray | None:
    """Bootstrap draws of a series' cost per write, computed as kvprof.analysis.reference does
    (the step's median over its writes; inside a decoder layer, layer - layer without the
    write); with ``controlled`` the median of each step over its control step (a burst of load
    falls on both, and cancels)."""
    main = modes.get("layer") or modes.get("writes")
    if main is None or main.writes_per_step <= 0:
        return None
    if controlled:
        ratios = _per_step_over_control(modes)
        if ratios is None:
            return None
        return _resampled_medians(ratios, rng)
    cost = _resampled_medians(np.asarray(main.samples_ns, dtype=float), rng)
    bare = modes.get("layer_no_write")
    if main.mode == "layer" and bare is not None:
        cost = cost - _resampled_medians(np.asarray(bare.samples_ns, dtype=float), rng)
    return cost / main.writes_per_step


def _resampled_medians(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The median of each of RESAMPLES resamples of ``x`` (drawn with replacement)."""
    medians: np.ndarray = np.median(x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))], axis=1)
    return medians


def _interval(base: dict[str, StepSamples], new: dict[str, StepSamples],
              controlled: bool = False) -> tuple[float, float] | None:
    """The 95 % bootstrap interval of NEW's cost per write minus BASE's (ns), or with
    ``controlled`` of NEW's cost over its control against BASE's, as a slowdown in %."""
    rng = np.random.default_rng(SEED)
    b, n = _draws(base, rng, controlled), _draws(new, rng, controlled)
    if b is None or n is None:
        return None
    tail = (1 - CONFIDENCE) / 2 * 100
    spread = (n / b - 1) * 100 if controlled else n - b
    lo, hi = np.percentile(spread, [tail, 100 - tail])
    return float(lo), float(hi)


# -- the gate --------------------------------------------------------------------------------

def _index(groups: pd.DataFrame) -> dict[tuple[str, str, int, str], dict[str, Any]]:
    if groups is None or groups.empty:
        return {}
    g = groups[groups["layer"].astype(str) == "all"] if "layer" in groups.columns else groups
    out = {}
    for r in g.to_dict("records"):
        if finite_or_none(r.get("cost_per_write_ns")) is not None:
            out[(str(r["variant"]), str(r["phase"]), int(r["size"]), str(r["source"]))] = r
    return out


def _interpreted(run: GateRun) -> set[str]:
    return {n for n, e in run.manifest.variants.items() if e.interpreted} if run.manifest is not None else set()


def _as_run(x: GateRun | pd.DataFrame) -> GateRun:
    return x if isinstance(x, GateRun) else GateRun(groups=x)


def regression_gate(base: GateRun | pd.DataFrame, new: GateRun | pd.DataFrame, threshold_pct: float,
                    source_order: list[str] | None = None, include_interpreted: bool = False) -> GateResult:
    """``base``/``new``: the runs (or just their group tables, kvprof.analysis.metrics.GROUP_COLUMNS);
    ``source_order``: BASE's trusted_sources."""
    if not (math.isfinite(threshold_pct) and threshold_pct >= 0):
        raise ValueError(f"threshold must be a finite percentage >= 0, got {threshold_pct}")
    base, new = _as_run(base), _as_run(new)
    out = GateResult(threshold_pct=threshold_pct)
    out.not_comparable, out.notes = comparability(base, new)
    if out.not_comparable:
        return out
    b, n = _index(base.groups), _index(new.groups)
    order = list(dict.fromkeys([*(source_order or []), *FALLBACK_ORDER]))
    rank = {s: i for i, s in enumerate(order)}
    interpreted = _interpreted(base) | _interpreted(new)
    points = sorted({k[:3] for k in b} | {k[:3] for k in n})
    for variant, phase, size in points:
        where = f"{variant} {phase} {size}"
        if variant in interpreted and not include_interpreted:
            out.left_out.append(f"{where}: ran under Triton's interpreter (its time is numpy's on the host, "
                                "not the kernel's); --include-interpreted judges it")
            continue
        common = sorted({k[3] for k in b if k[:3] == (variant, phase, size)}
                        & {k[3] for k in n if k[:3] == (variant, phase, size)},
                        key=lambda s: (rank.get(s, len(order)), s))
        if not common:
            in_b = any(k[:3] == (variant, phase, size) for k in b)
            in_n = any(k[:3] == (variant, phase, size) for k in n)
            why = "no source measured in both runs" if in_b and in_n else f"only in {'BASE' if in_b else 'NEW'}"
            out.unjudged.append(f"{where}: {why}")
            continue
        source = common[0]
        row = _judge(base, new, b[(variant, phase, size, source)], n[(variant, phase, size, source)],
                     (variant, phase, size, source), threshold_pct)
        if isinstance(row, str):
            out.unjudged.append(f"{where}: {row}")
        else:
            out.rows.append(row)
    return out


def _judge(base: GateRun, new: GateRun, rb: dict[str, Any], rn: dict[str, Any], key: tuple[str, str, int, str],
           threshold_pct: float) -> GateRow | str:
    """One point's row, or why it cannot be judged."""
    variant, phase, size, source = key
    base_ns, new_ns = float(rb["cost_per_write_ns"]), float(rn["cost_per_write_ns"])
    if base_ns <= 0:
        return f"BASE cost per write is {base_ns} ns ({source})"
    slower_pct = (new_ns - base_ns) / base_ns * 100.0
    pct: Callable[[float], float] = lambda ns: ns / base_ns * 100.0  # noqa: E731
    ib, i_n = _iqr_per_write(rb), _iqr_per_write(rn)
    spread = ib + i_n if ib is not None and i_n is not None else None
    row = GateRow(variant=variant, phase=phase, size=size, source=source, base_ns=base_ns, new_ns=new_ns,
                  slower_pct=slower_pct, drift_pct=None, judged_pct=slower_pct, noise="iqr", low_pct=None,
                  high_pct=None, confirmed_in=None, confirm_low_pct=None, base_iqr_ns=ib, new_iqr_ns=i_n,
                  spread_ns=spread, regressed=False)
    # per-step samples exist for the reference pass's figure; a profiler's reading has its group IQR
    sb, sn = (_series(r.timings, source, variant, phase, size) if source == "reference" else {}
              for r in (base, new))
    rb_, rn_ = _per_step_over_control(sb), _per_step_over_control(sn)
    interval = _interval(sb, sn, controlled=True) if rb_ is not None and rn_ is not None else None
    if interval is not None and rb_ is not None and rn_ is not None and float(np.median(rb_)) > 0:
        # both runs timed the machine's speed beside every step: judge each step over its control
        row.noise = "control"
        row.drift_pct = (sn[CONTROL].median_ns / sb[CONTROL].median_ns - 1) * 100.0
        row.judged_pct = (float(np.median(rn_)) / float(np.median(rb_)) - 1) * 100.0
        row.low_pct, row.high_pct = interval
        row.regressed = row.judged_pct > threshold_pct and row.low_pct > threshold_pct
        return row
    interval = _interval(sb, sn) if sb and sn else None
    if interval is not None:
        row.noise, row.low_pct, row.high_pct = "bootstrap", pct(interval[0]), pct(interval[1])
        row.regressed = slower_pct > threshold_pct and row.low_pct > threshold_pct
        for p in ("kineto", "nsys"):  # the same steps timed at another moment of each run
            conf = _interval(_series(base.timings, p, variant, phase, size),
                             _series(new.timings, p, variant, phase, size))
            if conf is not None:
                row.confirmed_in, row.confirm_low_pct = p, pct(conf[0])
                row.regressed = row.regressed and row.confirm_low_pct > threshold_pct
                break
        return row
    if spread is None:
        return f"noise unknown at {source} (no per-step samples and fewer than {MIN_SAMPLES} steps in a run)"
    row.low_pct, row.high_pct = pct(new_ns - base_ns - spread), pct(new_ns - base_ns + spread)
    row.regressed = slower_pct > threshold_pct and new_ns - base_ns > spread
    return row


__all__ = ["GateResult", "GateRow", "GateRun", "comparability", "regression_gate"]
