"""kvprof dashboard: a Streamlit + Plotly view of what ``python -m kvprof analyze`` writes.

Modules: app (entry, sidebar, navigation), data (finding runs, path checks, cached
reads of summary.json / writes.parquet / events.parquet, running the analyze pipeline
when a run lacks them), frames (pure DataFrame shaping), charts (pure Plotly figure
builders), ui (Streamlit helpers for exports), views/* (one module per page).
"""

from __future__ import annotations

import logging

# Streamlit's st.cache_data, applied at import (data.py, app.py) outside a Streamlit server
# (``kvprof dashboard`` reading the default roots before it starts one, tests, scripts),
# logs "No runtime found, using MemoryCacheStorageManager" once per cached function: that
# one message is dropped; anything else the logger says still shows.
_NO_RUNTIME = "No runtime found, using MemoryCacheStorageManager"


def _not_no_runtime(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_NO_RUNTIME)


logging.getLogger("streamlit.runtime.caching.cache_data_api").addFilter(_not_no_runtime)
