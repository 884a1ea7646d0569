"""analyze on traces kvprof did not write: per file what it reads (events, GPU rows, categories it
cannot read), the GPU verdict, the KV-write kernels by name and how their steps were found.

    python lab/foreign_traces.py DIR_OR_FILE [...]

Each trace is analysed alone, in this process, through kvprof's public API (``kvprof.api``),
as ``kvprof analyze FILE --no-files`` would; a trace analyze refuses is listed with its
one-line error. Nothing is written. Used to report how kvprof does on public traces held out
of the tests (HolisticTraceAnalysis' test data, fetched separately: see traces/public/README.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvprof import api
from kvprof.core.errors import KvprofError

SUFFIXES = (".json", ".json.gz", ".sqlite")


def one(path: Path) -> str:
    try:
        result = api.analyze(api.open_run(path), write_kernels=True)
    except KvprofError as exc:
        return f"{path.name}: refused: {exc}"
    s = result.summary
    out = []
    for tr in s.traces:
        g = tr.get("generic") or {}
        verdict = (f"GPU work: {len(g.get('streams') or [])} streams on {len(g.get('devices') or [])} device(s), "
                   f"{sum(d.get('kernels', 0) for d in g.get('devices') or []):,} kernels" if g.get("gpu")
                   else g.get("note", "?"))
        wk = next((t for t in (s.write_kernels or {}).get("traces") or [] if t.get("path") == tr.get("path")), {})
        writes = (f"{wk.get('write_kernels'):,} KV-write kernels, {wk.get('tied_step_and_layer', 0):,} tied; steps: "
                  f"{wk.get('step_method') or wk.get('no_steps_reason') or 'none'}") if wk.get("write_kernels") \
            else "no KV-write kernel by name"
        out.append(f"{path.name}: {tr.get('events'):,} events, {tr.get('gpu_events'):,} on GPU; {verdict}; {writes}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    files: list[Path] = []
    for a in argv or ["."]:
        p = Path(a)
        files += sorted(f for f in p.iterdir() if f.name.endswith(SUFFIXES)) if p.is_dir() else [p]
    for f in files:
        print(one(f), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
