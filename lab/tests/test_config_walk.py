"""lab/config_walk.py: the capture setting's walk from kvprof.api.capture, and its target."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]
ROOT = LAB.parent


def _walk_module():
    spec = importlib.util.spec_from_file_location("config_walk", LAB / "config_walk.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["config_walk"] = mod
    spec.loader.exec_module(mod)
    return mod


FIELDS = ("decode_sizes", "layers", "context_len", "cache_dtype", "seed", "run_id", "model")


@pytest.mark.parametrize("field", FIELDS)
def test_the_walk_of_a_capture_setting_climbs_back_up_at_most_five_times(field):
    cw = _walk_module()
    walk = cw.Walk(cw.Index(ROOT), field, cw.CARRIERS, cw.RESOLVERS)
    walk.run(cw.START)
    climbs = [s for s in walk.stops if s.climb]
    assert len(walk.stops) > 20  # the walk reaches the sessions and the passes, not just the facade
    assert len(climbs) <= 5, [f"{s.file}:{s.line} -> {s.target}" for s in climbs]
    files = {s.file for s in walk.stops}
    assert {"kvprof/capture/session.py", "kvprof/capture/reference.py"} <= files | {s.target_file for s in walk.stops}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_walk_counts_a_derived_value_asked_for_below_as_a_climb(tmp_path):
    """A planted tree: a session that asks the configuration for a derived value is one climb and
    one revisit; the resolution asking for it is neither."""
    root = _tree(tmp_path, {
        "kvprof/__init__.py": "",
        "kvprof/api.py": """
            from kvprof.run import capture as _capture
            def capture(config: CaptureConfig):
                return _capture(config)
            """,
        "kvprof/config.py": """
            class CaptureConfig:
                sizes: list
                def sizes_on(self, device):
                    return self.sizes
            """,
        "kvprof/run.py": """
            from kvprof.config import CaptureConfig
            from kvprof.session import Session
            def prepare(config: CaptureConfig):
                return config.sizes_on("cpu")
            def capture(config: CaptureConfig):
                prepare(config)
                Session(config)
            """,
        "kvprof/session.py": """
            from kvprof.config import CaptureConfig
            class Session:
                def __init__(self, config: CaptureConfig):
                    self.sizes = config.sizes_on("cpu")
            """,
    })
    cw = _walk_module()
    walk = cw.Walk(cw.Index(root), "sizes", ("CaptureConfig",), ("kvprof.run.prepare",))
    walk.run("kvprof.api.capture")
    kinds = [(s.kind, s.caller, s.climb) for s in walk.stops]
    assert ("derive", "kvprof.session.Session.__init__", True) in kinds
    assert ("derive", "kvprof.run.prepare", False) in kinds
    assert sum(s.climb for s in walk.stops) == 1
