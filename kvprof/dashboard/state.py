"""What the sidebar chose, handed to every page: root, runs, the open run, variants, source."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from kvprof.dashboard import data

UPLOAD_PREFIX = "upload: "


@dataclass
class Context:
    root: Path | None
    runs: list[data.RunEntry] = field(default_factory=list)
    uploads: dict[str, Path] = field(default_factory=dict)  # label -> outputs folder (outside the root)
    run: data.RunOutputs | None = None
    variants: list[str] = field(default_factory=list)
    source: str | None = None

    def labels(self) -> list[str]:
        """Every run a page can open: the root's runs, then this session's uploads."""
        return [e.rel for e in self.runs] + list(self.uploads)

    def entry(self, label: str) -> data.RunEntry | None:
        return next((e for e in self.runs if e.rel == label), None)

    def open(self, label: str) -> data.RunOutputs:
        """The run's outputs, analysing it first (cached outside the root) when it has none."""
        if label in self.uploads:
            return data.RunOutputs(label, self.uploads[label])
        e = self.entry(label)
        if e is None or self.root is None:
            raise data.DashboardError(f"no run {label!r} under the traces root")
        if e.analysed:
            out, note = data.ensure_outputs(e.path, self.root)
        else:
            with st.spinner(f"Analysing {label} with kvprof analyze (first time only; cached)..."):
                out, note = data.ensure_outputs(e.path, self.root)
        return data.RunOutputs(label, out, e.path, note)

    # the open run's tables, shaped once per rerun
    def summary(self) -> dict[str, Any]:
        assert self.run is not None
        return self.run.summary()

    def groups(self) -> pd.DataFrame:
        assert self.run is not None
        return self.run.groups()

    def writes(self) -> pd.DataFrame:
        assert self.run is not None
        return self.run.writes()
