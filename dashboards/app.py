"""``streamlit run dashboards/app.py [-- --root DIR [--run RUN_DIR]]``: kvprof's dashboard from a checkout.

The app is ``kvprof/dashboard/app.py``, the script ``kvprof dashboard`` serves from an
installed wheel; this entry puts the checkout first on the path (Streamlit adds only this
folder) and runs that script, on every rerun, so both commands open the same app.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
if str(CHECKOUT) not in sys.path:
    sys.path.insert(0, str(CHECKOUT))

from kvprof.commands.dashboard import app_path  # noqa: E402

runpy.run_path(str(app_path()), run_name="__main__")
