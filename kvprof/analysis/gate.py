"""The regression gate: is any (variant, phase, size) of NEW slower than in BASE?

``kvprof compare BASE NEW --fail-if-slower PCT`` asks this for CI. First the two runs must
be comparable (``comparability``: device, timing source, settings, Triton's interpreter,
torch threads, layers per step); if they are not, nothing is judged and each reason is
one line. Then each variant is paired with itself. Per (variant, phase, size) one source
is judged: the first, in BASE's ``trusted_sources`` order (the unprofiled reference first
where the run has one, then the least perturbed profiler), that both runs measured. The
figure is ``cost_per_write_ns`` (what a write costs the step, the figure analyze reports).

Every row gets an interval for its slowdown, and the intervals of one gate are family-wise:
with m rows judged on per-step samples, each is the central 1 - FAMILY_ALPHA / m bootstrap
interval (Bonferroni), so that identical runs put some row outside its interval at most
FAMILY_ALPHA of the time however many rows there are. A row with such an interval is then

- regressed when its slowdown and the low end of its interval are above PCT, however wide the
  interval (it already holds the noise: a 2x slowdown whose interval is +40 .. +300 % is a
  regression at 10 %, not "too noisy");
- passed when the high end of its interval is at or under PCT, or its noise, half its
  interval's width (as a ratio: ``GateRow.noise_pct``), is;
- inconclusive otherwise: the interval reaches both sides of PCT and is wider than it (too
  noisy to judge: neither "regressed" nor "passed" can be said). ``steps_needed`` says how many
  reference steps in both runs would bring its noise within PCT, or is None where the level
  noise alone (which steps do not average out) is as wide as PCT.

A row of step IQRs (no probability attached) is inconclusive whenever its noise exceeds PCT,
else regressed or passed as above.

The interval is, by what both runs hold:

- per-step samples and both control series (a CPU): each step's cost over the ``control``
  step timed next to it (the step's K and V stored by torch's own index_put: the machine's
  speed at that moment); the change of the median of those ratios. A process that the
  machine runs slower as a whole (seen: 1.7-2x on a shared 2-core machine), or a burst of
  load on a few steps, slows the control alike and is not a regression; slower code is.
  That control is torch's code, which the variants run too: a torch that became slower
  slows it with them and would cancel out. So the control is judged as a row of its own,
  ``CONTROL_ROW`` per (phase, size): torch's index_put over ``control_numpy`` (the same
  stores by numpy, no torch), every variant's steps of the point pooled; a slower torch
  regresses that row. Torch's control is the divisor because it tracks the machine at
  least as well (lab/gate_false_fails.py prints each control's spread between identical
  runs), the numpy one checks it. A series' level also moves with where its tensors landed,
  which no number of steps averages out: the spread across a run's variants of their torch
  control over their numpy control (each its own allocation; ``_level_noise``) widens these
  intervals;
- per-step samples without both controls (a GPU's CUDA events; a CPU capture older than
  ``control_numpy``, whose control cannot be checked): the interval of NEW's median cost per
  write minus BASE's, as a percentage of BASE's cost, which must also hold in the step
  timings of a profiled pass both runs made (the same writes timed at another moment of
  each run);
- without samples, from the groups' step IQRs: the slowdown +- the sum of both runs' step
  IQRs per write (not part of the family: no probability is attached to it);
- with neither (fewer than 4 steps) the noise is unknown and the row is not judged.

Step times that no clock gives (zero, negative, NaN, infinite) or series whose step counts
disagree are refused (TraceError): a run whose timings were edited is never judged.
Rows of a variant whose Triton kernel ran under Triton's interpreter (the interpreter's
time in numpy, which swung by a factor of 3 between identical runs) are left out unless
``include_interpreted``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.errors import Setting, TraceError, Words
from kvprof.core.numbers import finite_or_none
from kvprof.core.run import Manifest
from kvprof.core.sources import PROFILED, TRUST_ORDER, source_names
from kvprof.core.summary import Summary
from kvprof.core.timings import CONTROL, FREE_CONTROL, StepSamples, StepTimings

FALLBACK_ORDER = source_names(TRUST_ORDER)
FAMILY_ALPHA = 0.05  # identical runs: the chance that any row of the gate falls outside its interval
RESAMPLES = 10_000  # the tails of a dozen rows' family-wise intervals hold about 20 draws each
MIN_SAMPLES = 4  # as for an IQR: fewer steps say nothing of a run's scatter
SEED = 0  # the same two runs always get the same verdict
CONTROL_ROW = "torch index_put (control)"  # the variant name of a row that checks the control itself
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

    ``judged_pct`` is the slowdown the verdict is on, ``low_pct``/``high_pct`` its interval at
    ``confidence`` (the family-wise level); ``status`` "passed", "regressed" or "inconclusive"
    (the interval reaches both sides of the threshold and ``noise_pct`` is above it; ``steps``:
    the reference steps the row was judged on, ``steps_needed``: the steps that would settle
    it, None where no step count would). ``noise`` "control" (per-step samples and both runs'
    control series: the cost over the machine's speed; ``drift_pct``: how much slower NEW's
    machine ran torch's control), "control check" (the row CONTROL_ROW: torch's control over
    the numpy control; ``drift_pct``: how much slower NEW's machine ran the numpy one),
    ``level_pct``: the level noise of a series, widened into the interval (see ``_level_noise``);
    "bootstrap" (per-step samples; ``confirmed_in``: the profiled pass held to the same rule)
    or "iqr" (``spread_ns``: both runs' step IQRs per write; the interval is the slowdown +- it).
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
    status: str = "passed"
    confidence: float | None = None
    level_pct: float | None = None
    steps: int | None = None
    steps_needed: int | None = None

    @property
    def noise_pct(self) -> float | None:
        """How far NEW's cost over BASE's could be from what was measured, in %: half the interval's
        width taken as a ratio (sqrt of its high end over its low end, NEW/BASE), so that it is the
        half-width for a change near 0 and does not grow with the size of a real slowdown (a 2x
        slowdown measured to +-3 % has an interval of about +94 .. +106 %); infinite when the
        interval reaches -100 % (NEW's cost could be 0: the noise is larger than the write)."""
        if self.low_pct is None or self.high_pct is None:
            return None
        if self.low_pct <= -100:
            return math.inf
        return (math.sqrt((100 + self.high_pct) / (100 + self.low_pct)) - 1) * 100

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
    def inconclusive(self) -> list[GateRow]:
        return [r for r in self.rows if r.status == "inconclusive"]

    @property
    def steps_needed(self) -> tuple[int | None, list[GateRow]]:
        """(the reference steps in both runs that would settle every inconclusive row that more
        steps can settle, None if none can; the inconclusive rows on per-step samples that no
        step count settles: the level noise alone is as wide as the threshold, or it is 0)."""
        can = [r.steps_needed for r in self.inconclusive if r.steps_needed is not None]
        stuck = [r for r in self.inconclusive if r.steps_needed is None and r.confidence is not None]
        return (max(can) if can else None), stuck

    @property
    def comparable(self) -> bool:
        return not self.not_comparable

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"

    @property
    def verdict(self) -> str:
        """"not judged" (not comparable, or no row), "regressed" (a row regressed, whatever the
        others), "inconclusive" (no row regressed, a row too noisy to judge) or "passed"."""
        if not self.comparable or not self.rows:
            return "not judged"
        if self.regressed:
            return "regressed"
        return "inconclusive" if self.inconclusive else "passed"

    def to_json(self) -> dict[str, Any]:
        return {"threshold_pct": self.threshold_pct, "verdict": self.verdict, "passed": self.passed,
                "comparable": self.comparable, "family_alpha": FAMILY_ALPHA, "rule": RULE,
                "rows": [r.to_json() for r in self.rows], "unjudged": self.unjudged,
                "left_out": self.left_out, "not_comparable": self.not_comparable, "notes": self.notes,
                "steps_needed": self.steps_needed[0]}


RULE = ("regressed when judged_pct and low_pct, the low end of its interval, are above threshold_pct (noise iqr: "
        "and its noise is within threshold_pct); passed when high_pct is at or under threshold_pct (not for noise "
        "iqr) or the row's noise, half its interval as a ratio (sqrt((100 + high_pct) / (100 + low_pct)) - 1), "
        "is; inconclusive otherwise, with steps_needed: the reference steps in both runs that would bring the "
        "noise within threshold_pct (null where the level noise alone is that wide). Intervals are family-wise: "
        "with m rows on per-step samples, each is the central 1 - family_alpha / m bootstrap interval. noise "
        "control: the cost per write over the control series (each step over torch's index_put timed beside it), "
        "the interval widened by level_pct, the spread across each run's variants of torch's control over "
        "numpy's; noise "
        "control check: the control itself over the control_numpy series (numpy, no torch), every variant's steps "
        "pooled, so that a slower torch is a regression; noise bootstrap: the median difference per write, also "
        "in a profiled pass both runs timed (confirm_low_pct); noise iqr: the slowdown +- spread_ns (both runs' "
        "step IQR per write); rows of unknown noise are not judged")


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


def check_timings(run: GateRun, name: str) -> None:
    """Refuse (TraceError) step times no clock gives -- zero, negative, NaN, infinite -- a
    (variant, pass, phase, size) whose series hold different step counts, a reference pass
    with another count than the manifest's, and a run whose manifest records reference steps
    and whose timings are missing or unreadable: timings that were edited or corrupted are
    never judged."""
    steps = up_to = None
    if run.manifest is not None:  # the reference steps the capture ran (kvprof.capture.config.device_defaults)
        resolved = run.manifest.config.get("resolved")
        defaults = resolved.get("device_defaults") if isinstance(resolved, dict) else None
        steps = finite_or_none(defaults.get("reference_steps")) if isinstance(defaults, dict) else None
        # on a CPU left to its defaults a point's pass goes on within a time budget, up to this many
        up_to = finite_or_none(defaults.get("reference_steps_up_to")) if isinstance(defaults, dict) else None
    if run.timings is None:
        if steps is not None:  # every capture that records its reference steps writes their timings
            raise TraceError(f"{name}'s step timings are missing or unreadable, though its manifest records "
                             f"{int(steps)} reference steps; the gate judges nothing")
        return
    counts: dict[tuple[str, str, str, int], set[int]] = {}
    for r in run.timings.records:
        where = f"{name}'s step timings: {r.variant} {r.pass_} {r.phase} {r.size} {r.mode}"
        bad = next((x for x in r.samples_ns if not (math.isfinite(x) and x > 0)), None)
        if bad is not None:
            raise TraceError(f"{where} holds a step of {bad} ns (a step takes a positive, finite time); "
                             "the timings were edited or corrupted, the gate judges nothing")
        counts.setdefault((r.variant, r.pass_, r.phase, r.size), set()).add(len(r.samples_ns))
    # the reference counts the manifest allows: exactly reference_steps, or up to reference_steps_up_to
    bounds = None if steps is None else (int(steps), max(int(steps), int(up_to or steps)))
    for (variant, pass_, phase, size), n in counts.items():
        checked = bounds if pass_ == "reference" else None
        if len(n) > 1 or (checked is not None and not all(checked[0] <= c <= checked[1] for c in n)):
            want = ("" if checked is None else f" where the manifest says {checked[0]}" if checked[0] == checked[1]
                    else f" where the manifest says {checked[0]} to {checked[1]}")
            raise TraceError(f"{name}'s step timings: {variant} {pass_} {phase} {size} has series of "
                             f"{', '.join(map(str, sorted(n)))} steps{want}; the timings were edited or "
                             "corrupted, the gate judges nothing")


def _series(timings: StepTimings | None, pass_: str, variant: str, phase: str,
            size: int) -> dict[str, StepSamples]:
    if timings is None:
        return {}
    return {r.mode: r for r in timings.select(pass_=pass_)
            if (r.variant, r.phase, r.size) == (variant, phase, size) and len(r.samples_ns) >= MIN_SAMPLES}


def _cost_steps(modes: dict[str, StepSamples]) -> np.ndarray | None:
    """Each step's cost: the step, or inside a decoder layer the layer minus the layer without
    the write (as kvprof.analysis.reference computes it)."""
    main = modes.get("layer") or modes.get("writes")
    if main is None:
        return None
    x = np.asarray(main.samples_ns, dtype=float)
    if main.mode == "layer":
        bare = modes.get("layer_no_write")
        if bare is None or len(bare.samples_ns) != len(x):
            return None
        x = x - np.asarray(bare.samples_ns, dtype=float)
    return x


def _over(x: np.ndarray | None, modes: dict[str, StepSamples], control: str) -> np.ndarray | None:
    """x over the ``control`` step timed beside each step; None without that control."""
    c = modes.get(control)
    if x is None or c is None or len(c.samples_ns) != len(x):
        return None
    ratios: np.ndarray = x / np.asarray(c.samples_ns, dtype=float)
    return ratios


def _resampled_medians(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The median of each of RESAMPLES resamples of ``x`` (drawn with replacement)."""
    medians: np.ndarray = np.median(x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))], axis=1)
    return medians


def _ratio_draws(b: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Bootstrap draws of the change of the median of per-step ratios, NEW over BASE, in %."""
    rng = np.random.default_rng(SEED)
    draws: np.ndarray = (_resampled_medians(n, rng) / _resampled_medians(b, rng) - 1) * 100
    return draws


def _cost_draws(modes: dict[str, StepSamples], rng: np.random.Generator) -> np.ndarray | None:
    """Bootstrap draws of a series' cost per write (the step's median over its writes; inside a
    decoder layer, layer - layer without the write)."""
    main = modes.get("layer") or modes.get("writes")
    if main is None or main.writes_per_step <= 0:
        return None
    cost = _resampled_medians(np.asarray(main.samples_ns, dtype=float), rng)
    bare = modes.get("layer_no_write")
    if main.mode == "layer" and bare is not None:
        cost = cost - _resampled_medians(np.asarray(bare.samples_ns, dtype=float), rng)
    return cost / main.writes_per_step


def _difference_draws(base: dict[str, StepSamples], new: dict[str, StepSamples],
                      base_ns: float) -> np.ndarray | None:
    """Bootstrap draws of NEW's cost per write minus BASE's, as a percentage of ``base_ns``."""
    rng = np.random.default_rng(SEED)
    b, n = _cost_draws(base, rng), _cost_draws(new, rng)
    if b is None or n is None:
        return None
    draws: np.ndarray = (n - b) / base_ns * 100.0
    return draws


@dataclass
class _Pending:
    """A row and the bootstrap draws its interval is read from once the family's size is known."""

    row: GateRow
    draws: np.ndarray | None = None  # the slowdown, %
    confirm: np.ndarray | None = None  # the slowdown in a profiled pass, %
    level: float | None = None  # the level noise of one series (log units), _level_noise


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


def _timed(run: GateRun, mode: str) -> bool:
    return run.timings is not None and any(r.mode == mode for r in run.timings.records)


def regression_gate(base: GateRun | pd.DataFrame, new: GateRun | pd.DataFrame, threshold_pct: float,
                    source_order: list[str] | None = None, include_interpreted: bool = False,
                    check_control: bool = True, names: Callable[[str], str] = str) -> GateResult:
    """``base``/``new``: the runs (or just their group tables, kvprof.analysis.metrics.GROUP_COLUMNS);
    ``source_order``: BASE's trusted_sources. ``check_control=False`` divides by torch's control
    unchecked (what the gate did before the check; lab/gate_false_fails.py measures what that
    lets through). ``names``: how a row left out spells the setting that would judge it.
    Raises TraceError for step timings no clock gives (``check_timings``)."""
    if not (math.isfinite(threshold_pct) and threshold_pct >= 0):
        raise ValueError(f"threshold must be a finite percentage >= 0, got {threshold_pct}")
    base, new = _as_run(base), _as_run(new)
    check_timings(base, "BASE")  # first: an edited file may also read as runs that differ
    check_timings(new, "NEW")
    out = GateResult(threshold_pct=threshold_pct)
    out.not_comparable, out.notes = comparability(base, new)
    if out.not_comparable:
        return out
    checked = _timed(base, FREE_CONTROL) and _timed(new, FREE_CONTROL)
    divide = _timed(base, CONTROL) and _timed(new, CONTROL) and (checked or not check_control)
    if _timed(base, CONTROL) and _timed(new, CONTROL) and not divide:
        lacking = " and ".join(n for n, r in (("BASE", base), ("NEW", new)) if not _timed(r, FREE_CONTROL))
        out.notes.append(f"{lacking} timed no {FREE_CONTROL} series (captured before it was added): torch's index_put, "
                         "the control, cannot be checked, and a slower torch would slow it with the variants; the "
                         "rows are judged on the raw step times")
    b, n = _index(base.groups), _index(new.groups)
    order = list(dict.fromkeys([*(source_order or []), *FALLBACK_ORDER]))
    rank = {s: i for i, s in enumerate(order)}
    interpreted = _interpreted(base) | _interpreted(new)
    points = sorted({k[:3] for k in b} | {k[:3] for k in n})
    pending: list[_Pending] = []
    for variant, phase, size in points:
        where = f"{variant} {phase} {size}"
        if variant in interpreted and not include_interpreted:
            out.left_out.append(Words(f"{where}: ran under Triton's interpreter (its time is numpy's on the host, "
                                      "not the kernel's); ", Setting("include_interpreted"),
                                      " judges it").render(names))
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
                     (variant, phase, size, source), divide)
        if isinstance(row, str):
            out.unjudged.append(f"{where}: {row}")
        else:
            pending.append(row)
    if divide and checked and check_control:
        pending += _control_checks(base, new, sorted({(p.row.phase, p.row.size) for p in pending
                                                      if p.row.noise == "control"}))
    level = _level_noise(base, new) if divide else {}
    for p in pending:
        if p.row.noise in ("control", "control check"):
            p.level = level.get((p.row.phase, p.row.size))
    _decide(pending, threshold_pct)
    out.rows = [p.row for p in pending]
    return out


def _judge(base: GateRun, new: GateRun, rb: dict[str, Any], rn: dict[str, Any], key: tuple[str, str, int, str],
           divide: bool) -> _Pending | str:
    """One point's row with its bootstrap draws, or why it cannot be judged."""
    variant, phase, size, source = key
    base_ns, new_ns = float(rb["cost_per_write_ns"]), float(rn["cost_per_write_ns"])
    if base_ns <= 0:
        return f"BASE cost per write is {base_ns} ns ({source}): the noise is larger than the write"
    slower_pct = (new_ns - base_ns) / base_ns * 100.0
    ib, i_n = _iqr_per_write(rb), _iqr_per_write(rn)
    spread = ib + i_n if ib is not None and i_n is not None else None
    row = GateRow(variant=variant, phase=phase, size=size, source=source, base_ns=base_ns, new_ns=new_ns,
                  slower_pct=slower_pct, drift_pct=None, judged_pct=slower_pct, noise="iqr", low_pct=None,
                  high_pct=None, confirmed_in=None, confirm_low_pct=None, base_iqr_ns=ib, new_iqr_ns=i_n,
                  spread_ns=spread, regressed=False)
    # per-step samples exist for the reference pass's figure; a profiled pass's reading has its group IQR
    sb, sn = (_series(r.timings, source, variant, phase, size) if source == "reference" else {}
              for r in (base, new))
    rb_, rn_ = (_over(_cost_steps(s), s, CONTROL) if divide else None for s in (sb, sn))
    if rb_ is not None and rn_ is not None and float(np.median(rb_)) > 0:
        # both runs timed the machine's speed beside every step: judge each step over its control
        row.noise = "control"
        row.drift_pct = (sn[CONTROL].median_ns / sb[CONTROL].median_ns - 1) * 100.0
        row.judged_pct = (float(np.median(rn_)) / float(np.median(rb_)) - 1) * 100.0
        row.steps = min(len(rb_), len(rn_))
        return _Pending(row, draws=_ratio_draws(rb_, rn_))
    draws = _difference_draws(sb, sn, base_ns) if sb and sn else None
    if draws is not None:
        row.noise = "bootstrap"
        row.steps = min(len((s.get("layer") or s["writes"]).samples_ns) for s in (sb, sn))
        pending = _Pending(row, draws=draws)
        for p in source_names(PROFILED):  # the same steps timed at another moment of each run
            conf = _difference_draws(_series(base.timings, p, variant, phase, size),
                                     _series(new.timings, p, variant, phase, size), base_ns)
            if conf is not None:
                row.confirmed_in, pending.confirm = p, conf
                break
        return pending
    if spread is None:
        return f"noise unknown at {source} (no per-step samples and fewer than {MIN_SAMPLES} steps in a run)"
    row.low_pct, row.high_pct = (slower_pct - spread / base_ns * 100.0, slower_pct + spread / base_ns * 100.0)
    return _Pending(row)


def _control_checks(base: GateRun, new: GateRun, points: list[tuple[str, int]]) -> list[_Pending]:
    """Per (phase, size) whose rows were divided by torch's control: a row for the control itself,
    torch's index_put over the numpy control beside it (every variant's steps of the point pooled),
    NEW against BASE. Torch's own code slower shows here, as a regression of its own."""
    out: list[_Pending] = []
    for phase, size in points:
        pooled: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # torch's, numpy's, torch over numpy
        steps = []
        for run in (base, new):
            torch_, numpy_, per = [], [], 1
            for r in run.timings.records if run.timings is not None else ():
                if (r.pass_, r.phase, r.size) != ("reference", phase, size) or r.mode != CONTROL:
                    continue
                twin = _series(run.timings, "reference", r.variant, phase, size).get(FREE_CONTROL)
                if twin is None or len(twin.samples_ns) != len(r.samples_ns) or len(r.samples_ns) < MIN_SAMPLES:
                    continue
                torch_.append(np.asarray(r.samples_ns, dtype=float))
                numpy_.append(np.asarray(twin.samples_ns, dtype=float))
                per = max(1, r.writes_per_step)
            if not torch_:
                break
            steps.append(min(len(x) for x in torch_))
            t, f = np.concatenate(torch_) / per, np.concatenate(numpy_) / per
            pooled.append((t, f, t / f))
        if len(pooled) != 2:
            continue
        (tb, fb, rb), (tn, fn, rn) = pooled
        base_ns, new_ns = float(np.median(tb)), float(np.median(tn))
        row = GateRow(variant=CONTROL_ROW, phase=phase, size=size, source="reference", base_ns=base_ns, new_ns=new_ns,
                      slower_pct=(new_ns / base_ns - 1) * 100.0,
                      drift_pct=(float(np.median(fn)) / float(np.median(fb)) - 1) * 100.0,
                      judged_pct=(float(np.median(rn)) / float(np.median(rb)) - 1) * 100.0, noise="control check",
                      low_pct=None, high_pct=None, confirmed_in=None, confirm_low_pct=None, base_iqr_ns=None,
                      new_iqr_ns=None, spread_ns=None, regressed=False, steps=min(steps))
        out.append(_Pending(row, draws=_ratio_draws(rb, rn)))
    return out


def _level_noise(base: GateRun, new: GateRun) -> dict[tuple[str, int], float]:
    """Per (phase, size): how far the level of one timed series can sit from another's in the same
    process, in log units. A series' level moves with where its tensors landed, which no amount
    of steps averages out. Each variant of a run times its own allocations of the same stores by
    torch (``control``) and by numpy (``control_numpy``), step by step beside each other: the
    spread across the variants of log(median of torch's step over numpy's) is that of two
    series' levels (divided by sqrt 2 for one), with the machine's load cancelled in each step's
    ratio. Pooled over both runs (variances). Where a run timed no numpy series (captured before
    it was added), the spread of the control medians themselves is taken: it also holds the load
    of the moments each variant was timed at, so it only widens (docs/formats.md has both,
    measured by lab/gate_false_fails.py). Needs two variants' controls in each run; absent
    otherwise."""
    spreads: dict[tuple[str, int], list[float]] = {}
    for run in (base, new):
        levels: dict[tuple[str, int], list[float]] = {}
        ratio_levels: dict[tuple[str, int], list[float]] = {}
        records = run.timings.select(pass_="reference") if run.timings is not None else []
        numpy_ = {(r.variant, r.phase, r.size): r for r in records if r.mode == FREE_CONTROL}
        for r in records:
            if r.mode != CONTROL or not r.samples_ns:
                continue
            levels.setdefault((r.phase, r.size), []).append(math.log(r.median_ns))
            twin = numpy_.get((r.variant, r.phase, r.size))
            if twin is not None and len(twin.samples_ns) == len(r.samples_ns):
                ratio = np.asarray(r.samples_ns, dtype=float) / np.asarray(twin.samples_ns, dtype=float)
                ratio_levels.setdefault((r.phase, r.size), []).append(math.log(float(np.median(ratio))))
        for key, logs in levels.items():
            paired = ratio_levels.get(key, [])
            if len(paired) == len(logs) and len(paired) >= 2:
                spreads.setdefault(key, []).append(float(np.var(paired, ddof=1)) / 2)
            elif len(logs) >= 2:
                spreads.setdefault(key, []).append(float(np.var(logs, ddof=1)))
    return {key: math.sqrt(sum(v) / len(v)) for key, v in spreads.items() if len(v) == 2}


def _widened(row: GateRow, level: float, confidence: float) -> float:
    """The row's interval widened, in log space, by the level noise of the four series a ratio of
    two runs holds (each run's step series and its control: 2 x ``level`` in all), at the
    family's confidence; returns that widening (log units, 0 where nothing was widened)."""
    if row.low_pct is None or row.high_pct is None or row.low_pct <= -100:
        return 0.0
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    extra = z * 2 * level
    centre = math.log1p(row.judged_pct / 100)
    lo, hi = math.log1p(row.low_pct / 100), math.log1p(row.high_pct / 100)
    lo = centre - math.hypot(max(0.0, centre - lo), extra)
    hi = centre + math.hypot(max(0.0, hi - centre), extra)
    row.low_pct, row.high_pct = math.expm1(lo) * 100, math.expm1(hi) * 100
    row.level_pct = math.expm1(level) * 100
    return extra


def _steps_needed(steps: int | None, low_pct: float, high_pct: float, extra: float,
                  threshold_pct: float) -> int | None:
    """The reference steps (in both runs) at which a row's noise would be within the threshold,
    from its bootstrap interval over ``steps`` steps (``low_pct`` .. ``high_pct``, before the level
    noise): the bootstrap's half-width (log units) shrinks as 1/sqrt(steps), the level noise's
    ``extra`` does not. None where no step count can do it (the level noise alone is at the
    threshold) or the interval says nothing of its width (it reaches -100 %)."""
    if not steps or low_pct <= -100:
        return None
    allowed = math.log1p(threshold_pct / 100)
    if extra >= allowed:
        return None
    half = (math.log1p(high_pct / 100) - math.log1p(low_pct / 100)) / 2
    return max(steps, math.ceil(steps * half * half / (allowed * allowed - extra * extra)))


def _decide(pending: list[_Pending], threshold_pct: float) -> None:
    """Each row's family-wise interval, then its status. A row with a family-wise interval (one
    read from bootstrap draws) regresses when its slowdown and its interval's low end are above
    the threshold, however wide the interval: the interval already holds the noise, so a real
    2x slowdown is caught on a noisy machine. It passes when its interval's high end is at or
    under the threshold, or its noise is; the rest are inconclusive (the interval reaches both
    sides of the threshold and is wider than it), with the steps that would settle them
    (``steps_needed``). A row of step IQRs (no probability attached) must have its noise within
    the threshold to be judged either way."""
    family = sum(1 for p in pending if p.draws is not None)
    confidence = 1 - FAMILY_ALPHA / max(1, family)
    tail = (1 - confidence) / 2 * 100
    for p in pending:
        row = p.row
        extra = 0.0
        if p.draws is not None:
            row.confidence = confidence
            row.low_pct, row.high_pct = (float(x) for x in np.percentile(p.draws, [tail, 100 - tail]))
            boot = (row.low_pct, row.high_pct)
            if p.level is not None:
                extra = _widened(row, p.level, confidence)
        if p.confirm is not None:
            row.confirm_low_pct = float(np.percentile(p.confirm, tail))
        noise = row.noise_pct
        if noise is None or row.low_pct is None or row.high_pct is None:
            continue
        above = row.judged_pct > threshold_pct and row.low_pct > threshold_pct
        if row.confirm_low_pct is not None:
            above = above and row.confirm_low_pct > threshold_pct
        family_wise = p.draws is not None
        if above and (family_wise or noise <= threshold_pct):
            row.status, row.regressed = "regressed", True
        elif noise <= threshold_pct or (family_wise and row.high_pct <= threshold_pct):
            row.status = "passed"
        else:
            row.status = "inconclusive"
            if family_wise:
                row.steps_needed = _steps_needed(row.steps, *boot, extra, threshold_pct)


__all__ = ["CONTROL_ROW", "FAMILY_ALPHA", "GateResult", "GateRow", "GateRun", "check_timings", "comparability",
           "regression_gate"]
