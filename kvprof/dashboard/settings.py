"""How the dashboard spells a command-line setting it names (``kvprof.core.errors.Setting``).

A page that says what to capture to fill it names capture's settings, and the Overview names
report's: the flags are kvprof.commands' (above the dashboard), so ``kvprof dashboard`` hands
them to the server it starts in ``ENV_FLAGS``; without them (``streamlit run app.py``, a test)
a setting reads as its field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping

ENV_FLAGS = "KVPROF_DASHBOARD_FLAGS"  # JSON: {a setting's field: its flag}
# the settings the pages name: capture's variants, context, decode sizes and prefill sizes,
# report's HTML file, bench's output folder
NAMED = ("variants", "context", "decode_sizes", "prefill_sizes", "html", "out")


def setting_names(env: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """A setting's field -> how the pages spell it: its flag where ``kvprof dashboard`` gave one."""
    try:
        flags = json.loads((os.environ if env is None else env).get(ENV_FLAGS) or "{}")
    except ValueError:
        flags = {}
    given = {k: v for k, v in flags.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(
        flags, dict) else {}
    return lambda field: given.get(field, field)
