"""Build and convert the normalized event table (kvprof.core.schema.SCHEMA).

Readers collect plain numpy columns; this module fills every column they left out with
its default (-1 or null), dictionary-encodes strings, and converts between Arrow (what
is stored) and pandas (what the pure analysis functions take).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from kvprof.core.schema import SCHEMA, STRING_COLUMNS


def dict_array(codes: np.ndarray, values: Sequence[str | bytes | None]) -> pa.DictionaryArray:
    """Codes into ``values`` (-1 = null) as an Arrow dictionary array: names are interned once."""
    codes = np.asarray(codes, dtype=np.int32)
    mask = codes < 0
    idx = pa.array(np.where(mask, 0, codes), type=pa.int32(), mask=mask if mask.any() else None)
    vals = pa.array(list(values) if len(values) else [""], type=pa.string())
    return pa.DictionaryArray.from_arrays(idx, vals)


def _string_column(value: Any, n: int) -> pa.Array:
    if value is None:
        return pa.nulls(n, type=SCHEMA.field("kind").type)
    if isinstance(value, pa.DictionaryArray):
        return value
    if isinstance(value, tuple) and len(value) == 2:  # (codes, values)
        return dict_array(*value)
    if isinstance(value, (str, bytes)):
        return dict_array(np.zeros(n, dtype=np.int32), [value])
    arr = pa.array(value, type=pa.string())
    return arr.dictionary_encode().cast(SCHEMA.field("kind").type)


def build_table(columns: Mapping[str, Any], n: int) -> pa.Table:
    """A SCHEMA table of ``n`` rows from the given columns; the rest take their defaults.

    Integer columns: numpy arrays or scalars. String columns: a (codes, values) pair, a
    DictionaryArray, a plain sequence of str/None, or one str for every row.
    """
    unknown = set(columns) - set(SCHEMA.names)
    if unknown:
        raise ValueError(f"not event table columns: {sorted(unknown)}")
    arrays = []
    for f in SCHEMA:
        value = columns.get(f.name)
        if f.name in STRING_COLUMNS:
            arr = _string_column(value, n)
        else:
            if value is None:
                value = np.full(n, -1, dtype=f.type.to_pandas_dtype())
            elif np.isscalar(value):
                value = np.full(n, value, dtype=f.type.to_pandas_dtype())
            target = f.type.to_pandas_dtype()
            value = np.asarray(value)
            if target == np.int32 and value.dtype != np.int32 and value.size:
                # an id that does not fit int32 (a corrupt device or layer) is unknown, not wrapped
                value = np.where((value < -(1 << 31)) | (value >= (1 << 31)), -1, value)
            arr = pa.array(value.astype(target, copy=False), type=f.type)
        if len(arr) != n:
            raise ValueError(f"column {f.name} has {len(arr)} rows, expected {n}")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def empty_table() -> pa.Table:
    return build_table({}, 0)


def to_frame(table: pa.Table) -> pd.DataFrame:
    """pandas view for the analysis: strings become categoricals, integers stay int64/int32."""
    return table.to_pandas(types_mapper=None, strings_to_categorical=True, self_destruct=False)


def from_frame(df: pd.DataFrame) -> pa.Table:
    """Back to SCHEMA (after attribution filled columns in pandas)."""
    cols: dict[str, Any] = {}
    for name in SCHEMA.names:
        if name not in df.columns:
            continue
        s = df[name]
        if name in STRING_COLUMNS:
            if isinstance(s.dtype, pd.CategoricalDtype):
                cats = [str(c) for c in s.cat.categories]
                cols[name] = (s.cat.codes.to_numpy(dtype=np.int32), cats)
            else:
                cols[name] = [None if (v is None or (isinstance(v, float) and np.isnan(v))) else str(v) for v in s]
        else:
            cols[name] = s.to_numpy()
    return build_table(cols, len(df))
