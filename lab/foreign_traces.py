"""analyze on traces kvprof did not write: per file what it reads (events, GPU rows, categories it
cannot read), the GPU verdict and the devices with their kernels, the graph launches and the
kernels tied to a replay, the KV-write kernels by name, how many are tied to a step and a layer
(steps, layers), the reason for each one that is not, and how the steps were found.

    python lab/foreign_traces.py DIR_OR_FILE [...]

Each trace is analysed alone, in this process, through kvprof's public API (``kvprof.api``),
as ``kvprof analyze FILE --no-files`` would; a trace analyze refuses is listed with its
one-line error. Nothing is written. Used to report how kvprof does on public traces held out
of the tests (HolisticTraceAnalysis' test data and engine traces of vLLM and SGLang, fetched
separately: see traces/public/README.md).
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
        devices = "; ".join(f"device {d.get('device')} {d.get('name') or '?'}: {d.get('kernels', 0):,} kernels"
                            for d in g.get("devices") or [])
        wk = next((t for t in (s.write_kernels or {}).get("traces") or [] if t.get("path") == tr.get("path")), {})
        gr = wk.get("graph") or {}
        graph = (f"graph launches {gr.get('launches', 0):,}, kernels tied to a replay "
                 f"{gr.get('replayed_kernels', 0):,} ({gr.get('replayed_write_kernels', 0):,} KV writes in "
                 f"{gr.get('replays_with_writes', 0):,} replays)")
        if wk.get("write_kernels"):
            layers = (wk.get("step_layer") or {}).get("layers") or []
            untied = "; ".join(f"{u['kernels']:,} untied: {u['reason']}" for u in wk.get("unassigned") or [])
            writes = (f"{wk.get('write_kernels'):,} KV-write kernels ({', '.join(f['family'] for f in wk['families'])})"
                      f", {wk.get('tied_step_and_layer', 0):,} tied to a step and a layer"
                      f" ({wk.get('steps_count', 0):,} steps, {len(layers)} layers)"
                      f"{'; ' + untied if untied else ''}; steps: {wk.get('step_method') or 'none'}")
        else:
            writes = "no KV-write kernel by name"
        out.append(f"{path.name}: {tr.get('events'):,} events, {tr.get('gpu_events'):,} on GPU; {verdict}"
                   f"{' (' + devices + ')' if devices else ''}; {graph}; {writes}")
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
