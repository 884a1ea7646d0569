"""Tables as people read them, and the landing view's numbers; pure pandas, no Streamlit.

``display`` turns a frame into text cells: numbers with a few significant digits and
thousands separators, booleans as yes/no, missing values as "n/a" (never "None" or
"nan"). The CSV export keeps the raw frame. ``landing_frame`` lays out, for one source,
each variant's GPU cost per write with its spread, the saving per decode step with its
spread and the writes' share of the step: what the landing view and the HTML report show.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from kvprof.analysis.figures import (
    INTERPRETED,
    MARK,
    MEASURED,
    NEGATIVE,
    NEGATIVE_WHY,
    NOISE,
    NOT_APPLICABLE,
    Figure,
    classify,
    derived,
)
from kvprof.core import variants as V
from kvprof.core.timings import SourceTiming
from kvprof.dashboard.frames import (
    COMPARE_PAIR,
    NS_PER_US,
    OVERVIEW_OWN,
    OVERVIEW_PAIR,
    OVERVIEW_TIMES,
    interpreted_variants,
    measured_writes,
    pair_kind,
    phase_size,
    verdict_text,
)

MISSING = "n/a"


def cell(v: Any, digits: int = 4) -> str:
    """One value as text: 0.885, 12.3, 4,096, yes/no, n/a."""
    if v is None or v is pd.NA or v is pd.NaT:
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if not math.isfinite(f):
            return MISSING
        if f.is_integer() and abs(f) < 1e15:
            return f"{int(f):,}"
        if abs(f) >= 1000:
            return f"{f:,.0f}"
        return f"{f:.{digits}g}"
    s = str(v)
    return MISSING if s in ("None", "nan", "NaN", "<NA>", "") else s


UNIT_SUFFIXES = (("_us", "µs"), ("_ns", "ns"), ("_gbs", "GB/s"), ("_pct", "%"))


def header(name: object) -> str:
    """A frame's column name as a table shows it: its unit spelled as everywhere else (``us`` and
    ``*_us`` read µs, ``*_gbs`` GB/s), words apart; the CSV keeps the frame's own names."""
    text = str(name)
    if text in ("us", "gbs"):
        return "µs" if text == "us" else "GB/s"
    for suffix, unit in UNIT_SUFFIXES:
        if text.endswith(suffix) and len(text) > len(suffix):
            return f"{text[: -len(suffix)].replace('_', ' ')} {unit}"
    return text


def display(df: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """Every cell as text (see ``cell``); column names and order kept."""
    return pd.DataFrame({c: [cell(v, digits) for v in df[c].tolist()] for c in df.columns}, index=df.index,
                        columns=df.columns)


TABLE_TESTID = "kvprof-table"
# Theme-neutral: text and background inherit the page's, lines are a grey that reads on light and dark.
TABLE_CSS = (f"<style>div[data-testid='{TABLE_TESTID}']{{overflow-x:auto;margin-bottom:0.5rem}}"
             f"div[data-testid='{TABLE_TESTID}'] table{{border-collapse:collapse;font-size:0.875rem;color:inherit}}"
             f"div[data-testid='{TABLE_TESTID}'] th,div[data-testid='{TABLE_TESTID}'] td{{border:1px solid "
             "rgba(128,128,128,0.25);padding:0.25rem 0.5rem;text-align:left;vertical-align:top}"
             f"div[data-testid='{TABLE_TESTID}'] th{{font-weight:600;background:rgba(128,128,128,0.08)}}</style>")


def html_table(df: pd.DataFrame, digits: int = 4) -> str:
    """The table as one static HTML block: the cells of ``display``, HTML-escaped, every column in full.

    One element for the browser to insert, where a Streamlit table renders each cell through
    its Markdown pipeline (a 24 x 19 table is 456 of them; about a second of a slow CPU for a
    page of tables).
    """
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in df.columns)
    cols = [[e(cell(v, digits)) for v in df[c].tolist()] for c in df.columns]
    rows = "".join("<tr>" + "".join(f"<td>{v}</td>" for v in row) + "</tr>" for row in zip(*cols))
    return (f"{TABLE_CSS}<div data-testid='{TABLE_TESTID}'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


LANDING_COLUMNS = ("variant", "role", "verdict", "source", "phase", "size", "phase_size", "cost_us", "cost_lo_us",
                   "cost_hi_us", "spread_from", "saving_ms", "saving_spread_ms", "share_pct", "cost_kind",
                   "saving_kind")


def _why(kind: str) -> str:
    return {INTERPRETED: "Triton's interpreter", NEGATIVE: NEGATIVE_WHY}.get(kind, "not measured")


def labelled(df: pd.DataFrame, figures: dict[str, str], derived_from: dict[str, str] | None = None,
             digits: int = 4, variant: str = "variant") -> pd.DataFrame:
    """``display(df)`` under the one rule (kvprof.analysis.figures): each column of ``figures``
    (column -> the column holding its kind) reads Figure.text where it is not a measurement
    (``n/a (negative: noise)``, ``16,120.000 *``); each of ``derived_from`` (column -> the kind
    column of the figure it is computed from) reads ``n/a (interpreted)`` / ``n/a (negative:
    noise)`` where that is not a measurement; the ``variant`` of a row with an interpreted
    figure is marked ``*``. The kind columns stay, as the CSV's ``figure`` columns."""
    out = display(df, digits)
    for col, kcol in figures.items():
        out[col] = [Figure(float(v), k, _why(k)).text(digits - 1) if k in (NEGATIVE, INTERPRETED) else t
                    for v, k, t in zip(df[col], df[kcol], out[col])]
    for col, kcol in (derived_from or {}).items():
        out[col] = [derived(Figure(None if k == MEASURED else 0.0, k, _why(k)), None).text() if k != MEASURED else t
                    for k, t in zip(df[kcol], out[col])]
    kinds = list(dict.fromkeys([*figures.values(), *(derived_from or {}).values()]))
    if variant in out.columns and kinds:
        marked = [any(df[k].iloc[i] == INTERPRETED for k in kinds) for i in range(len(df))]
        out[variant] = [f"{v} {MARK}" if m else v for v, m in zip(out[variant], marked)]
    return out


def overview_table(df: pd.DataFrame, cost_column: str = "GPU µs/write") -> pd.DataFrame:
    """The Overview's table (frames.overview_frame, its cost column named ``cost_column``) as text
    under the one rule: GB/s and % of peak n/a where the cost is not a measurement; speed-up,
    savings and ITL where the variant's or the baseline's is not."""
    # the variant's other times: the interpreter's too where its cost is (`*`); never re-judged by
    # the cost's sign
    times = df.assign(_times=[INTERPRETED if k == INTERPRETED else MEASURED for k in df["figure"]])
    out = labelled(times, {cost_column: "figure", **{c: "_times" for c in OVERVIEW_TIMES if c in df.columns}},
                   {**{c: "figure" for c in OVERVIEW_OWN}, **{c: "ratio figure" for c in OVERVIEW_PAIR}})
    return out.drop(columns="_times")


def observer_table(df: pd.DataFrame) -> pd.DataFrame:
    """The observer-effect table (frames.observer_frame) as text under the one rule: each cost
    labelled, the reading-over-reference ratio n/a where either is not a measurement."""
    return labelled(df, {"reading µs/write": "reading figure", "reference µs/write": "reference figure"},
                    {"reading / reference (write)": "ratio figure"})


def compare_table(df: pd.DataFrame) -> pd.DataFrame:
    """Compare runs' table (frames.compare_runs) as text under the one rule: each run's cost labelled,
    every ratio and saving n/a where either cost is not a measurement."""
    return labelled(df, {"before µs/write": "before figure", "after µs/write": "after figure"},
                    {c: "ratio figure" for c in COMPARE_PAIR})


def _cost_spread(r: Any, writes: pd.DataFrame | None) -> tuple[float, float, str]:
    """The 25th-75th percentile band around a group's cost per write, and where it comes from."""
    cost = float(r.cost_per_write_ns)
    iqr = r.step_iqr_ns
    if iqr is not None and np.isfinite(iqr) and r.writes and r.steps:
        half = float(iqr) / (float(r.writes) / float(r.steps)) / 2.0  # the step's IQR shared over its writes
        return cost - half, cost + half, "step IQR / writes per step"
    if writes is not None and len(writes):
        w = writes[(writes["variant"].astype(str) == r.variant) & (writes["source"].astype(str) == r.source)
                   & (writes["phase"].astype(str) == r.phase) & (pd.to_numeric(writes["size"]) == r.size)]
        col = "gpu_new_ns" if bool(r.graph) and "gpu_new_ns" in w else "gpu_span_ns"
        vals = pd.to_numeric(w[col], errors="coerce").dropna() if col in w else pd.Series(dtype=float)
        if len(vals) >= 4:
            lo, hi = float(vals.quantile(0.25)), float(vals.quantile(0.75))
            # the group's cost may be a step average: centre the band on it, keep its width
            half = (hi - lo) / 2.0
            return cost - half, cost + half, "per-write IQR"
    return cost, cost, "none"


def _landing_rows(groups: pd.DataFrame, source: str) -> pd.DataFrame:
    g = groups[(groups["layer"].astype(str) == "all") & (groups["source"].astype(str) == source)]
    return g[g["cost_per_write_ns"].notna()]


def spread_needs_writes(groups: pd.DataFrame, source: str) -> bool:
    """Whether some landing row's spread must come from writes.parquet (no step IQR in the group):
    when none does, the landing view needs summary.json only."""
    g = _landing_rows(groups, source)
    iqr = pd.to_numeric(g["step_iqr_ns"], errors="coerce")
    writes, steps = (pd.to_numeric(g[c], errors="coerce") for c in ("writes", "steps"))
    ok = np.isfinite(iqr) & (writes > 0) & (steps > 0)
    return not bool(ok.all())


def landing_frame(groups: pd.DataFrame, comp: dict[str, Any] | None, summary: dict[str, Any], source: str,
                  writes: pd.DataFrame | None = None, layers: int = 80, itl_before_ms: float = 12.05,
                  gpu: bool = True) -> pd.DataFrame:
    """One row per variant and (phase, size) of ``source``: cost and its band, saving and its spread, share.
    ``gpu``: the source timed GPU work (kvprof.core.timings.SourceTiming.gpu); where it did not (a
    CPU's wall clock) there is no saving per decode step and no share of the ITL, not even the
    baseline's 0."""
    g = _landing_rows(groups, source)
    w = measured_writes(writes, source=source) if writes is not None and len(writes) else None
    verdicts = {n: verdict_text(v) for n, v in (summary.get("variants") or {}).items()}
    comp_rows = {(r["variant"], r["phase"], int(r["size"])): r for r in (comp or {}).get("rows", [])
                 if r["source"] == source}
    base = (comp or {}).get("baseline")
    rows = []
    for r in g.itertuples(index=False):
        lo, hi, how = _cost_spread(r, w)
        rows.append({"variant": r.variant, "role": V.info(str(r.variant)).role.value,
                     "verdict": verdicts.get(r.variant, MISSING), "source": source, "phase": r.phase,
                     "size": int(r.size), "phase_size": phase_size(r.phase, r.size),
                     "cost_us": r.cost_per_write_ns / NS_PER_US, "cost_lo_us": lo / NS_PER_US,
                     "cost_hi_us": hi / NS_PER_US, "spread_from": how})
    df = pd.DataFrame(rows, columns=list(LANDING_COLUMNS[:11]))
    half = {(r["variant"], r["phase"], r["size"]): (r["cost_hi_us"] - r["cost_lo_us"]) / 2.0 for _, r in df.iterrows()}
    bands = {(r["variant"], r["phase"], r["size"]): r["spread_from"] for _, r in df.iterrows()}
    saving, spread, share, judged = [], [], [], []
    for _, r in df.iterrows():
        c = comp_rows.get((r["variant"], r["phase"], r["size"]))
        s = c.get("saving_per_step_ms") if c else (0.0 if r["variant"] == base and r["phase"] == "decode" else None)
        s = s if gpu else None
        saving.append(np.nan if s is None else float(s))
        banded = {r["spread_from"], bands.get((base, r["phase"], r["size"]), "none")}
        if r["variant"] == base:
            spread.append(np.nan)  # the baseline against itself: 0 by definition
        elif c and c.get("measured_saving_spread_ms") is not None:
            spread.append(float(c["measured_saving_spread_ms"]))
        elif s is not None and base is not None:
            hb = half.get((base, r["phase"], r["size"]), 0.0)
            spread.append(layers * math.hypot(hb, half[(r["variant"], r["phase"], r["size"])]) / 1e3)
        else:
            spread.append(np.nan)
        # a spread to judge the saving by: measured in the layer, or both costs' bands
        judged.append(r["variant"] == base or (c is not None and c.get("measured_saving_spread_ms") is not None)
                      or "none" not in banded)
        share.append(100.0 * layers * r["cost_us"] / (itl_before_ms * 1e3) if r["phase"] == "decode" and gpu
                     else np.nan)
    df["saving_ms"], df["saving_spread_ms"], df["share_pct"] = saving, spread, share
    # the one rule (kvprof.analysis.figures): what each cost can be taken for
    interp = interpreted_variants(summary)
    df["cost_kind"] = [classify(c, interpreted=v in interp, cost=True).kind
                       for v, c in zip(df["variant"], df["cost_us"])]
    # a saving: the kind of an untrusted cost it is computed from (its own or the baseline's), the
    # baseline's own 0 as it is, else noise within its spread or with none to judge it
    kinds = {(v, p, z): k for v, p, z, k in zip(df["variant"], df["phase"], df["size"], df["cost_kind"])}
    saving_kinds = []
    for v, p, z, k, s, sp, j in zip(df["variant"], df["phase"], df["size"], df["cost_kind"], df["saving_ms"],
                                    df["saving_spread_ms"], judged):
        pk = pair_kind(k, kinds.get((base, p, z), NOT_APPLICABLE))
        saving_kinds.append(NOT_APPLICABLE if not np.isfinite(s) else MEASURED if v == base else pk
                            if pk != MEASURED else classify(s, spread=sp if j else None, needs_spread=True).kind)
    df["saving_kind"] = saving_kinds
    order = {v: i for i, v in enumerate(V.ordered(list(df["variant"].astype(str))))}
    return (df.assign(_o=df["variant"].map(order)).sort_values(["_o", "phase", "size"]).drop(columns="_o")
            .reset_index(drop=True)[list(LANDING_COLUMNS)])


LANDING_TABLE = {"variant": "variant", "verdict": "fused?", "phase_size": "phase · size",
                 "cost_us": "GPU µs/write", "spread": "IQR µs", "saving_ms": "saves ms/step",
                 "saving_spread_ms": "± ms", "share_pct": "writes' share of ITL %"}


def landing_table(df: pd.DataFrame, timing: SourceTiming | None = None) -> pd.DataFrame:
    """The landing view's table: the same numbers as its charts, in text, headed in the source's unit
    (``timing``); a saving or share that cannot exist says why, as capture's table does."""
    t = df.assign(spread=[f"{cell(lo, 3)} – {cell(hi, 3)}" if how != "none" else MISSING
                          for lo, hi, how in zip(df["cost_lo_us"], df["cost_hi_us"], df["spread_from"])])
    names = dict(LANDING_TABLE)
    if timing is not None:
        names["cost_us"] = timing.per_write_short
        names["spread"] = f"IQR {timing.unit}"
    out = display(t[list(LANDING_TABLE)].rename(columns=names), digits=3)
    if "cost_kind" in df.columns:  # a negative cost reads n/a (negative: noise), an interpreted one `*`
        out[names["cost_us"]] = [Figure(float(c), k).text(3) if k in (NEGATIVE, INTERPRETED) else v
                                 for c, k, v in zip(df["cost_us"], df["cost_kind"], out[names["cost_us"]])]
        out[names["variant"]] = [f"{v} {MARK}" if k == INTERPRETED else v
                                 for v, k in zip(out[names["variant"]], df["cost_kind"])]
    for col in ("saving_ms", "saving_spread_ms", "share_pct"):
        why = [f"{MISSING} ({phase})" if phase != "decode" else
               f"{MISSING} ({timing.no_step_why[0]})" if timing is not None and not timing.gpu else MISSING
               for phase in df["phase"].astype(str)]
        out[names[col]] = [w if v == MISSING else v for w, v in zip(why, out[names[col]])]
    if "saving_kind" in df.columns:  # the one rule for what is computed from the costs
        out[names["saving_ms"]] = [
            Figure(float(s), NOISE, "within its spread" if np.isfinite(sp) else "no spread to judge it").text(
                3, sign=True) if k == NOISE else
            derived(Figure(0.0, k, _why(k)), None).text() if k in (INTERPRETED, NEGATIVE) else t
            for s, sp, k, t in zip(df["saving_ms"], df["saving_spread_ms"], df["saving_kind"], out[names["saving_ms"]])]
        out[names["share_pct"]] = [derived(Figure(0.0, k, _why(k)), None).text()
                                   if k in (INTERPRETED, NEGATIVE) and np.isfinite(v) else t
                                   for v, k, t in zip(df["share_pct"], df["cost_kind"], out[names["share_pct"]])]
    return out


def outliers(values: pd.Series) -> tuple[int, float]:
    """How many values lie beyond 1.5 IQR of the quartiles (a box plot's outliers), and the largest value."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if len(v) < 4:
        return 0, float(v.max()) if len(v) else float("nan")
    q1, q3 = v.quantile(0.25), v.quantile(0.75)
    fence = 1.5 * (q3 - q1)
    return int(((v < q1 - fence) | (v > q3 + fence)).sum()), float(v.max())
