"""One rank of a multi-rank capture (``capture --ranks N``), as manifest.json records it.

A multi-rank run holds one Kineto trace per variant and rank; the manifest's variant
entries describe rank 0 (so a reader that knows nothing of ranks still opens the run),
and ``ranks`` lists every rank with its own files, device and reported write paths, so
the analysis can read each rank's traces and check that every rank took the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("gloo", "nccl")


def _int(v: Any) -> bool:
    return v.__class__ is int and 0 <= v < (1 << 31)


@dataclass
class RankEntry:
    """What one rank wrote: its trace per variant, the device it ran on, the paths its writer reported."""

    rank: int
    files: dict[str, str] = field(default_factory=dict)  # variant -> trace file name
    paths: dict[str, dict[str, int]] = field(default_factory=dict)  # variant -> path -> writes
    device: dict[str, Any] = field(default_factory=dict)
    timings: str | None = None  # this rank's step_timings file

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rank": self.rank, "files": dict(self.files),
                             "paths": {k: dict(v) for k, v in self.paths.items()}, "device": dict(self.device)}
        if self.timings is not None:
            d["timings"] = self.timings
        return d

    @classmethod
    def from_json(cls, doc: Any, warnings: list[str]) -> RankEntry | None:
        """None (and a warning) for an entry that is not one; ill-typed keys are dropped with a warning."""
        if not isinstance(doc, dict) or not _int(doc.get("rank")):
            warnings.append("manifest: a ranks entry without a valid rank; ignored")
            return None
        rank = int(doc["rank"])
        files_in = doc.get("files")
        files = ({str(k): v for k, v in files_in.items() if isinstance(v, str)} if isinstance(files_in, dict) else {})
        if isinstance(files_in, dict) and len(files) != len(files_in):
            warnings.append(f"manifest: rank {rank}: ignored file names that are not strings")
        paths: dict[str, dict[str, int]] = {}
        raw = doc.get("paths")
        if isinstance(raw, dict):
            for variant, counts in raw.items():
                if isinstance(counts, dict) and all(isinstance(n, str) and _int(c) for n, c in counts.items()):
                    paths[str(variant)] = {str(n): int(c) for n, c in counts.items()}
                else:
                    warnings.append(f"manifest: rank {rank}: ignored the paths of {variant!r} (not path -> count)")
        device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
        timings = doc.get("timings") if isinstance(doc.get("timings"), str) else None
        return cls(rank=rank, files=files, paths=paths, device=dict(device or {}), timings=timings)


__all__ = ["BACKENDS", "RankEntry"]
