"""The vectorised interval statistics equal the per-group reference functions exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from kvprof.trace.intervals import busy_and_overlap, gaps, grouped_interval_stats


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 200), st.integers(0, 40), st.integers(0, 2)),
                min_size=1, max_size=60))
def test_grouped_equals_per_group(rows):
    grp, s, d, ln = (np.array(c, dtype=np.int64) for c in zip(*rows))
    s = s + 1_700_000_000_000_000_000  # absolute epoch-ns clocks must not overflow anything
    e = s + d
    res = grouped_interval_stats(grp, s, e, ln, 5)
    for g in range(5):
        m = grp == g
        want = (*busy_and_overlap(s[m], e[m], ln[m]), *gaps(s[m], e[m])) if m.any() else (0, 0, 0, 0)
        assert (res["union"][g], res["overlap"][g], res["gaps"][g], res["idle"][g]) == want
