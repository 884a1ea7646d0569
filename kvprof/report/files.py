"""Write analysis outputs atomically, as one set (kvprof.core.atomic.atomic_outputs).

summary.json (orjson, indented), summary.csv (the groups table), events.parquet (the
normalized event table of every trace, SCHEMA), writes.parquet (one row per write,
kvprof.analysis.writes.WRITE_COLUMNS). A reader never sees half a file. A CSV text cell
that a spreadsheet would run as a formula (a variant named ``=HYPERLINK(...)``) is written
with a leading ``'``, and a CR inside a cell as its escape (kvprof.core.text.csv_cell).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvprof.core.atomic import atomic_file, atomic_path
from kvprof.core.errors import OutputError
from kvprof.core.rundir import RunDir
from kvprof.core.text import csv_cell


def write_json(path: Path, doc: dict[str, Any]) -> None:
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    with atomic_file(path, "wb") as fh:
        fh.write(data + b"\n")


def csv_safe(df: pd.DataFrame) -> pd.DataFrame:
    """The frame with every text cell (and column name) a safe CSV cell (kvprof.core.text.csv_cell);
    numbers untouched."""
    out = df.rename(columns=csv_cell)
    for c in out.columns:
        if not pd.api.types.is_numeric_dtype(out[c]):
            out[c] = out[c].map(csv_cell)
    return out


def frame_csv(df: pd.DataFrame) -> str:
    """``df`` as CSV text, formula-safe: summary.csv's content."""
    return csv_safe(df).to_csv(index=False)


def groups_csv(groups: pd.DataFrame, summary: Any) -> pd.DataFrame:
    """summary.csv's rows: the groups, and last a ``figure`` column saying what each row's cost per
    write can be taken for by the one rule (kvprof.analysis.figures: measured, interpreted,
    negative, n/a), so a spreadsheet reader sees an interpreter's time or a noise cost as such."""
    from kvprof.analysis.figures import classify

    if "cost_per_write_ns" not in groups.columns or "variant" not in groups.columns:
        return groups
    interp = {n for n, v in (summary.variants or {}).items() if v.interpreted}
    return groups.assign(figure=[classify(c, interpreted=str(v) in interp, cost=True).kind
                                 for v, c in zip(groups["variant"], groups["cost_per_write_ns"])])


def write_csv(path: Path, df: pd.DataFrame) -> None:
    with atomic_file(path, "w") as fh:
        csv_safe(df).to_csv(fh, index=False)


PARQUET_SCHEMA_KEY = b"kvprof.schema"  # file metadata: which kvprof table, which version
EVENTS_SCHEMA = "kvprof.events/1"
WRITES_SCHEMA = "kvprof.writes/1"


def with_schema(table: pa.Table | pd.DataFrame, schema: str) -> pa.Table:
    """The table with ``schema`` under PARQUET_SCHEMA_KEY in its metadata (docs/formats.md)."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), PARQUET_SCHEMA_KEY: schema.encode()})


def write_parquet(path: Path, table: pa.Table | pd.DataFrame) -> None:
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    with atomic_path(path) as tmp:
        try:
            pq.write_table(table, tmp, compression="zstd")
        except OSError as exc:
            raise OutputError(f"cannot write {path.name}: {exc.strerror or ' '.join(str(exc).split())}") from None


def writes_for_parquet(writes: pd.DataFrame) -> pd.DataFrame:
    """Stable dtypes for the dashboard: strings as str, booleans as bool, numbers as float/int."""
    w = writes.copy()
    for c in ("trace", "source", "variant", "phase", "attribution", "kernel_names"):
        if c in w.columns:
            w[c] = w[c].astype("string")
    for c in ("graph", "during_capture"):
        if c in w.columns:
            w[c] = w[c].astype(bool)
    for c in w.columns:
        if w[c].dtype == object:
            w[c] = pd.to_numeric(w[c], errors="coerce")
    return w


def write_analysis(loaded: Any, result: Any, out: Path, rules: Any = None) -> list[Path]:
    """Every analysis output into ``out`` as one set (kvprof.core.rundir.RunDir.staged_outputs): all
    four files replace the old ones together, summary.json (the marker readers require) last.

    ``rules`` (kvprof.tools.scrub.Rules): scrub every string before it is written, so a capture
    under $HOME or with a token in a trace never writes them into its outputs.
    """
    events = (
        pa.concat_tables([t.events for t in loaded.traces], promote_options="permissive")
        if len(loaded.traces) > 1 else loaded.traces[0].events
    )
    doc, groups, writes = result.summary.to_json(), result.groups, writes_for_parquet(result.writes)
    if rules is not None:
        from kvprof.tools.scrub import scrub_document, scrub_frame, scrub_table

        doc, groups, writes = scrub_document(doc, rules), scrub_frame(groups, rules), scrub_frame(writes, rules)
        events, _ = scrub_table(events, rules)
    run = RunDir(out)
    with run.staged_outputs() as stage:
        write_parquet(stage.events, with_schema(events, EVENTS_SCHEMA))
        write_parquet(stage.writes, with_schema(writes, WRITES_SCHEMA))
        write_csv(stage.summary_csv, groups_csv(groups, result.summary))
        write_json(stage.summary, doc)
    return run.outputs
