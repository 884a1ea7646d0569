"""What HolisticTraceAnalysis (HTA 0.5) needs from a kvprof run, in one place.

HTA finds a trace's rank in the ``distributedInfo`` metadata a captured trace carries
(``kvprof.core.run.hta_metadata_json``, written by capture).

``TraceAnalysis(trace_dir=D)`` reads every ``.json`` and ``.gz`` file in ``D`` as one
trace per rank, so a run folder (manifest.json, summary.json, step_timings.json and one
trace per variant, all rank 0) is not something it can open. ``write_hta_folders`` gives
each variant a folder of its own, ``RUN/hta/<variant>/``, holding that variant's trace
(one per rank after ``capture --ranks N``) under its own name: hard links, so no space is
used, or copies where the file system has none; never symbolic links, which a zip or a
copy to another machine would break.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kvprof.core.run import Manifest, plain_name
from kvprof.core.rundir import RunDir


def variant_traces(manifest: Manifest) -> dict[str, list[str]]:
    """Each run variant's torch.profiler trace file names, one per rank (rank order)."""
    out: dict[str, list[str]] = {}
    for name, entry in manifest.variants.items():
        if not entry.available or not plain_name(name):
            continue
        if manifest.ranks:
            files = [r.files.get(name) for r in sorted(manifest.ranks, key=lambda r: r.rank)]
        else:
            files = [entry.files.get("torch_trace")]
        names = [f for f in files if isinstance(f, str) and plain_name(f)]
        if names:
            out[name] = names
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # no hard links here (some network and FUSE file systems)
        shutil.copyfile(src, dst, follow_symlinks=False)


def write_hta_folders(run_dir: Path) -> dict[str, Path]:
    """``run_dir/hta/<variant>/`` for every variant with a torch.profiler trace, made whole in a
    temporary folder and renamed in (an older ``hta`` folder is replaced); the folders by
    variant, empty when the run has no torch.profiler trace (an nsys-only capture)."""
    run = RunDir(run_dir)
    traces = {variant: [n for n in names if run.file(n).is_file() and not run.file(n).is_symlink()]
              for variant, names in variant_traces(run.read_manifest()).items()}
    traces = {variant: names for variant, names in traces.items() if names}
    if not traces:
        return {}
    with run.staged_hta() as tmp:
        for variant, names in traces.items():
            (tmp / variant).mkdir()
            for name in names:
                _link_or_copy(run.file(name), tmp / variant / name)
    return {variant: run.hta_folder(variant) for variant in traces}


__all__ = ["variant_traces", "write_hta_folders"]
