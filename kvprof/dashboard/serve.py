"""``kvprof dashboard``'s server: Streamlit, with the pages' imports done before the first visitor.

Streamlit imports a script's modules on its first run, so without this the first visitor
after a start also waits for pyarrow, Plotly and kvprof's analysis to be imported (most of
the gap between "first visit, server just started" and "new browser, warm server" in
docs/dashboard.md). A background thread imports the pages once Streamlit's runtime runs:
not earlier, because the pages' cached functions would be declared with no runtime (a
warning each) and the imports would delay the server's own start. Python's per-module import locks make
a visitor who arrives meanwhile wait for, not repeat, a module the thread is importing.

Run as ``python -m kvprof.dashboard.serve run APP [streamlit options]``: the arguments are
``streamlit``'s own.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
import threading
import time

log = logging.getLogger("kvprof.dashboard")

RUNTIME_WAIT_S = 60.0  # a server not up by then is not warmed; the first visitor imports instead


def page_modules() -> list[str]:
    """The modules a page run needs beyond Streamlit: every page, the data readers, the parquet reader."""
    from kvprof.dashboard import views

    return ["pyarrow.parquet", "kvprof.dashboard.data"] + [
        f"kvprof.dashboard.views.{m.name}" for m in pkgutil.iter_modules(views.__path__)]


def serving() -> bool:
    """Streamlit's runtime exists and its loop runs: the server is (about to be) listening, so the
    imports no longer compete with its start-up."""
    from streamlit import runtime
    from streamlit.runtime import RuntimeState

    return runtime.exists() and runtime.get_instance().state is not RuntimeState.INITIAL


def warm(wait_s: float = RUNTIME_WAIT_S) -> list[str]:
    """Import the pages once Streamlit serves; the modules imported (none if it never came up)."""
    end = time.monotonic() + wait_s
    while not serving():
        if time.monotonic() > end:
            return []
        time.sleep(0.02)
    done = []
    for name in page_modules():
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception:  # the page run will raise it again, where the visitor sees it  # noqa: BLE001
            log.debug("warm import of %s failed", name, exc_info=True)
    return done


def main(argv: list[str] | None = None) -> int:
    from streamlit.web import cli

    threading.Thread(target=warm, name="kvprof-dashboard-warm", daemon=True).start()
    if argv is not None:
        sys.argv = ["streamlit", *argv]
    cli.main(prog_name="streamlit")  # click: exits with streamlit's status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
