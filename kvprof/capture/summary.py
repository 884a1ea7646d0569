"""The first summary ``capture`` prints: what ran, per variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def print_capture_summary(run_dir: Path, manifest: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"kvprof capture {manifest.get('run_id')}")
    for col in ("variant", "status", "path taken", "kernels/write"):
        table.add_column(col)
    for name, v in manifest["variants"].items():
        if not v["available"]:
            table.add_row(name, "skipped", v["reason"] or "", "")
            continue
        fused = v.get("fused", {})
        kpw = v.get("kernels_per_write") or {}
        kpw_text = ", ".join(f"{k}: {n}" for k, n in kpw.items() if n is not None) or "n/a (no GPU)"
        table.add_row(name, "captured", fused.get("state", "?"), kpw_text)
    console.print(table)
