"""gpu/run_gpu_checks.sh refuses what it does not know: an unknown step, or an unknown part of
perf1's PERF1_PARTS, is said on stderr and the script exits 2 (after any other steps ran), so a
typo never reads as a run that measured nothing. No GPU is needed to reach either refusal."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "gpu" / "run_gpu_checks.sh"


def _run(tmp_path: Path, *steps: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *steps], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path), **env})


def test_an_unknown_step_is_said_and_exits_2(tmp_path: Path) -> None:
    done = _run(tmp_path, "no-such-step")
    assert done.returncode == 2
    assert "unknown step no-such-step" in done.stderr


@pytest.mark.parametrize("parts", ["eagr", "tests eagr cards"])
def test_an_unknown_perf1_part_runs_nothing_and_exits_2(tmp_path: Path, parts: str) -> None:
    done = _run(tmp_path, "perf1", PERF1_PARTS=parts)
    assert done.returncode == 2
    assert done.stderr.strip() == "perf1: unknown PERF1_PARTS eagr (known: tests eager rope-4096 cards)"
    assert not any(p.name.startswith("perf1-") for p in tmp_path.iterdir())  # no part ran


CARD_TABLES = ROOT / "gpu" / "card_tables.sh"


@pytest.mark.parametrize("args, env, said", [
    (["env", "eagr"], {}, "card_tables.sh: unknown part eagr (known: env tests eager eager-ab prefill peers-32 "
                          "peers-1-8 own rope-4096 rope-order rope-grid rope-stream tune-store)"),
    (["env"], {"CARD_BUDGET": "5m"}, "card_tables.sh: CARD_BUDGET must be whole seconds, got '5m'"),
    (["tune-store"], {"TUNE_BUDGET": "x"}, "card_tables.sh: TUNE_BUDGET must be whole seconds, got 'x'"),
    (["peers-1-8"], {"PEERS_LIMIT": "2m"}, "card_tables.sh: PEERS_LIMIT must be whole seconds, got '2m'"),
])
def test_card_tables_refuses_an_unknown_part_or_budget_and_writes_nothing(tmp_path: Path, args: list[str],
                                                                         env: dict[str, str], said: str) -> None:
    """gpu/card_tables.sh says a bad part or budget in one line, exits 2 and leaves $OUT empty."""
    done = subprocess.run(["bash", str(CARD_TABLES), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path), **env})
    assert done.returncode == 2
    assert done.stderr.strip() == said
    assert list(tmp_path.iterdir()) == []
