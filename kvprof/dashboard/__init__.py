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


def _inert(record: logging.LogRecord) -> bool:
    """The dashboard's log records with every control, bidi and line-separator character shown
    as its escape (``kvprof.core.text.printable``), the traceback's line breaks kept: a run's or an
    upload's name, or an error quoting a trace's or a sidecar's text, reached the server's
    terminal with its escape sequences."""
    from kvprof.core.text import printable

    record.msg, record.args = printable(record.getMessage()), None
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = "\n".join(printable(line) for line in text.split("\n"))
    return True


logging.getLogger("kvprof.dashboard").addFilter(_inert)
