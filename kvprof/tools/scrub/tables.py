"""Scrub documents, Arrow tables and frames in memory, and Parquet files (analyze's outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprof.core.atomic import atomic_path
from kvprof.core.errors import TraceError
from kvprof.tools.scrub.rules import Rules, ScrubReport, too_big, total_size

# ---------------------------------------------------------------- documents and tables in memory


def scrub_document(obj: Any, rules: Rules) -> Any:
    """A JSON-like value with the rules applied to every string, keys included (for outputs
    scrubbed before they are written: manifest, summary)."""
    if isinstance(obj, str):
        return rules.scrub(obj)[0]
    if isinstance(obj, dict):
        return {scrub_document(k, rules) if isinstance(k, str) else k: scrub_document(v, rules) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_document(v, rules) for v in obj]
    return obj


def _scrub_array(arr: Any, rules: Rules) -> tuple[Any, int]:
    """(array, values changed) for a string or dictionary-of-strings Arrow array."""
    import pyarrow as pa

    if pa.types.is_dictionary(arr.type) and pa.types.is_string(arr.type.value_type):
        values = arr.dictionary.to_pylist()
        new = [v if v is None else rules.scrub(v)[0] for v in values]
        changed = sum(a != b for a, b in zip(values, new))
        if not changed:
            return arr, 0
        return pa.DictionaryArray.from_arrays(arr.indices, pa.array(new, type=arr.type.value_type)), changed
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        values = arr.to_pylist()
        new = [v if v is None else rules.scrub(v)[0] for v in values]
        changed = sum(a != b for a, b in zip(values, new))
        return (pa.array(new, type=arr.type), changed) if changed else (arr, 0)
    return arr, 0


def scrub_table(table: Any, rules: Rules) -> tuple[Any, int]:
    """(Arrow table, values changed) with the rules applied to every string column."""
    import pyarrow as pa

    columns, changed = [], 0
    for col in table.columns:
        chunks = []
        for chunk in col.chunks:
            new, n = _scrub_array(chunk, rules)
            chunks.append(new)
            changed += n
        columns.append(pa.chunked_array(chunks, type=col.type))
    return (pa.Table.from_arrays(columns, schema=table.schema), changed) if changed else (table, 0)


def scrub_frame(df: Any, rules: Rules) -> Any:
    """A pandas frame with the rules applied to its text (object, string, category) columns."""
    import pandas as pd

    out = df.copy()
    for c in out.columns:
        s = out[c]
        if isinstance(s.dtype, pd.CategoricalDtype):
            cats = [rules.scrub(x)[0] if isinstance(x, str) else x for x in s.cat.categories]
            if len(set(cats)) == len(cats):
                out[c] = s.cat.rename_categories(cats)
            else:
                out[c] = s.astype(object).map(lambda v: rules.scrub(v)[0] if isinstance(v, str) else v)
        elif s.dtype == object or pd.api.types.is_string_dtype(s.dtype):
            out[c] = s.map(lambda v: rules.scrub(v)[0] if isinstance(v, str) else v)
    return out


def scrub_parquet(path: Path, rules: Rules) -> ScrubReport:
    """Rewrite a Parquet file (analyze's events/writes) with the rules on every string column."""
    import pyarrow.parquet as pq

    report = ScrubReport(path, "parquet", bytes_before=total_size([path]))
    try:
        meta = pq.ParquetFile(path).metadata
        if sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) > rules.max_bytes:
            raise too_big(path, rules.max_bytes, "decompresses to")
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TraceError(f"{path}: not readable Parquet ({' '.join(str(exc).split())[:200]})") from None
    new, changed = scrub_table(table, rules)
    if not changed:
        report.bytes_after = report.bytes_before
        return report
    report.strings = changed
    with atomic_path(path) as tmp:
        pq.write_table(new, tmp, compression="zstd")
    report.rewritten = True
    report.bytes_after = total_size([path])
    return report
