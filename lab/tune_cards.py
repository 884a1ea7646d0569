#!/usr/bin/env python3
"""Launch tables per card for triton_fused: sweep on this card, the rows to commit, and the
comparison with SGLang's JIT ``store_cache`` at the same points.

    OUT=/tmp/out python lab/tune_cards.py                 # on a GPU: $OUT/cards-<card>.json and the rows
    python lab/tune_cards.py --derive A.json B.json ...    # anywhere: every card's rows and the fallback

On a GPU, each point (row shape x dtype x tokens, the bench's case: a 256 MB pool at random
slots, W writes per captured graph, ``kvprof.bench.run.BenchCase``) times every candidate
launch shape of ``lab/tune_fused.py`` plus the shape every card row of
``kvprof.kvcache.writers.triton_tables.STORE_TABLES`` hands out there, each checked bitwise against
index_put first and timed as CUDA-graph replays (median of 100 replays, median over
``CARDS_CAPTURES`` captures), and after an L2 flush (``kvprof.bench.timing.time_cold``), as is
SGLang's ``store_cache`` (``CARDS_PEER``; it needs SGLang on the path, else the comparison says
why not). The card's row takes, per point, :func:`pick_best`'s shape: the fastest in graphs is
not always the fastest from DRAM (on an H100, 32x128 bf16 at 64 tokens: the graphs' fastest
shape was 5.5 % slower after a flush than the pick, 2.75 against 2.61 µs, and above store_cache
there, 2.65), so among
the shapes at or below the peer in both modes, else among all, the one whose worse ratio to
the fastest of either mode is smallest. ``CARDS_COLD=best`` times only the graphs' fastest
and the table's shape after a flush (the pick is then the graphs' fastest). Points run in
order of what the tables decide (the 32x128 bandwidth-bound points first), the JSON is
rewritten after every point, and no new point starts after ``CARDS_BUDGET_S`` seconds, so a
run cut short keeps every point it measured.

It prints, for this card: the rows of ``STORE_TABLES`` to commit (16-bit and fp8 tables, row
classes of the grid that were not measured completely kept from the current row and marked
so), and a table of every point: store_cache and kvprof's best, in graph replays and after an
L2 flush, with the difference in per cent.

``--derive`` reads one or more cards' JSON and prints each card's rows and the fallback for
a card without a row: at each point, the shape that was timed on every card whose largest
slowdown against that card's fastest is the smallest (minimax regret over the measured cards).

Environment: ``CARDS_SHAPES`` (``32x128,8x128,1x128``), ``CARDS_DTYPES`` (``bf16,fp8_e4m3``),
``CARDS_TOKENS`` (``4096,32768,512,64,8,1``), ``CARDS_CAPTURES`` (3), ``CARDS_PEER``
(``sglang_store_cache``; empty: none), ``CARDS_COLD`` (``all``; ``best``), ``CARDS_BUDGET_S``
(270), ``CARDS_PRECOMPILE`` (1).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"  # the compiled kernels, whatever the shell says
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab"))

T0 = time.perf_counter()
ANY = 1 << 62


def fail(msg: str) -> None:
    print(f"tune_cards.py: error: {msg}", file=sys.stderr)
    raise SystemExit(1)


def _env_list(name: str, default: str, parse) -> list:
    raw = os.environ.get(name, default)
    try:
        return [parse(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        fail(f"cannot read {name}={raw!r} (e.g. CARDS_SHAPES=32x128,8x128 CARDS_TOKENS=4096,32768)")
        raise


def cold_mode() -> str:
    """``CARDS_COLD``: ``all`` (every candidate after a flush too) or ``best``."""
    mode = os.environ.get("CARDS_COLD", "all").strip()
    if mode not in ("all", "best"):
        fail(f"CARDS_COLD must be all or best, got {mode!r}")
    return mode


def _env_int(name: str, default: int, least: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        fail(f"{name} must be an integer, got {raw!r}")
        raise
    if value < least:
        fail(f"{name} must be at least {least}, got {value}")
    return value


def oneline(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


# -- the rows: pure functions of the measurements (tested on a CPU, lab/tests) ----------------------
def row_class(heads: int, dim: int) -> int:
    """The table's row-bytes bound a shape falls in (K+V input bytes per token, 16-bit inputs)."""
    row_bytes = 2 * heads * dim * 2
    return 1024 if row_bytes <= 1024 else 8192 if row_bytes <= 8192 else ANY


def _cfg(label: list) -> tuple:
    """A record's config label ([block_t, warps, split(, "stream")]) as a TritonConfig's fields."""
    return (int(label[0]), int(label[1]), int(label[2]), "stream" in label[3:])


def derive_rows(points: list[dict], current: dict[bool, list[tuple[int, int, tuple]]], grid_tokens: list[int],
                pick=None) -> tuple[dict[bool, list[tuple[int, int, tuple]]], dict[bool, list[int]]]:
    """Table rows from measured points: per dtype kind (fp8 or not) and row class, one row per
    grid token count (the last one's bound is ANY) holding ``pick(point)`` (default: the
    point's recorded pick, ``best``: :func:`pick_best`'s, or in older JSON the fastest in
    graphs), consecutive equal rows merged. A row class whose every grid token
    count was not measured keeps the ``current`` rows (listed in the second return value)."""
    pick = pick or (lambda p: _cfg(p["best"]["config"]))
    tokens = sorted(set(grid_tokens))
    out: dict[bool, list[tuple[int, int, tuple]]] = {}
    kept: dict[bool, list[int]] = {}
    for fp8 in (False, True):
        by_class: dict[int, dict[int, tuple]] = {}
        for p in points:
            if p["fp8"] != fp8 or "best" not in p:
                continue
            by_class.setdefault(row_class(p["heads"], p["dim"]), {})[p["tokens"]] = pick(p)
        rows: list[tuple[int, int, tuple]] = []
        kept[fp8] = []
        for cls in sorted({c for c, _, _ in current[fp8]} | set(by_class)):
            measured = by_class.get(cls, {})
            if not tokens or any(t not in measured for t in tokens):
                rows += [r for r in current[fp8] if r[0] == cls]
                kept[fp8].append(cls)
                continue
            mine = [(cls, ANY if i == len(tokens) - 1 else t, measured[t]) for i, t in enumerate(tokens)]
            merged = [r for i, r in enumerate(mine) if i == len(mine) - 1 or mine[i + 1][2] != r[2]]
            rows += merged
        out[fp8] = rows
    return out, kept


def regret(cand: dict, fastest_us: float, fastest_cold: float | None) -> float:
    """A candidate's worse ratio to a point's fastest: in graphs, and after a flush where both
    were timed so."""
    ratio = cand["us"] / fastest_us
    if fastest_cold and cand.get("cold_us"):
        ratio = max(ratio, cand["cold_us"] / fastest_cold)
    return ratio


def pick_best(cands: list[dict], peer: dict) -> tuple[dict, str]:
    """The point's shape and why: where every timed candidate has an after-flush time, among
    those at or below the peer in both modes (if the peer was timed and any is), else among
    all, the smallest :func:`regret` (ties: faster in graphs); without the flush times, the
    fastest in graphs. ``cands`` must hold at least one timed candidate."""
    timed = [c for c in cands if "us" in c]
    fastest = min(timed, key=lambda c: c["us"])
    if not all(c.get("cold_us") for c in timed):
        return fastest, "fastest in graphs"
    fastest_cold = min(c["cold_us"] for c in timed)
    g, c = peer.get("graph_us"), peer.get("cold_us")
    meets = [x for x in timed if g and c and x["us"] <= g and x["cold_us"] <= c]
    pool = meets or timed
    best = min(pool, key=lambda x: (regret(x, fastest["us"], fastest_cold), x["us"]))
    why = "at or below the peer in both modes, least regret" if meets else "least regret over both modes"
    return best, why


def minimax_pick(cards: list[dict[tuple, dict]]):
    """The fallback's pick at a point: among the shapes timed on every card, the one whose
    largest :func:`regret` on any card is smallest (ties: the first card's smaller)."""
    def pick(p: dict) -> tuple:
        key = (p["heads"], p["dim"], p["fp8"], p["tokens"])
        per_card = [c[key] for c in cards if key in c]
        common = set.intersection(*({_cfg(x["config"]) for x in q["candidates"] if "us" in x} for q in per_card))
        if not common:
            return _cfg(p["best"]["config"])

        def worst(cfg: tuple) -> tuple[float, float]:
            ratios = []
            for q in per_card:
                timed = [x for x in q["candidates"] if "us" in x]
                colds = [x["cold_us"] for x in timed if x.get("cold_us")]
                cold = min(colds) if len(colds) == len(timed) else None
                cand = next(x for x in timed if _cfg(x["config"]) == cfg)
                ratios.append(regret(cand, min(x["us"] for x in timed), cold))
            return max(ratios), ratios[0]

        return min(sorted(common), key=worst)
    return pick


def rows_source(name: str, rows: list[tuple[int, int, tuple]]) -> str:
    """Python source of one table, as triton_tables.py spells it."""
    lines = [f"{name}: Table = ["]
    for row_max, tok_max, (bt, nw, sp, stream) in rows:
        args = f"{bt}, {nw}" + (f", {sp}" if sp != 1 or stream else "") + (", stream=True" if stream else "")
        lines.append(f"    ({'_ANY' if row_max >= ANY else row_max}, {'_ANY' if tok_max >= ANY else tok_max}, "
                     f"TritonConfig({args})),")
    return "\n".join(lines + ["]"])


def current_rows(card: str | None) -> dict[bool, list[tuple[int, int, tuple]]]:
    from kvprof.kvcache.writers.triton_tables import store_tables

    tables = store_tables(card)
    return {fp8: [(r, t, (c.block_t, c.num_warps, c.split, c.stream)) for r, t, c in tables[1 if fp8 else 0]]
            for fp8 in (False, True)}


def comparison(points: list[dict]) -> list[str]:
    """Per point: store_cache and kvprof's best, graph and cold, and the difference in per cent."""
    head = f"{'shape':>6} {'dtype':>9} {'tokens':>6} | {'graph: sgl':>10} {'best':>8} {'diff':>7} " \
           f"{'table':>8} | {'cold: sgl':>10} {'best':>8} {'diff':>7} {'table':>8}"
    lines = [head]
    for p in points:
        if "best" not in p:
            continue
        peer = p.get("peer") or {}
        g, c = peer.get("graph_us"), peer.get("cold_us")
        best, cold = p["best"]["us"], p.get("best_cold_us")
        table_us, table_cold = p.get("table_us"), p.get("table_cold_us")

        def pct(mine, theirs):
            return f"{100 * (mine / theirs - 1):+6.1f}%" if mine and theirs else "    n/a"

        def num(x):
            return f"{x:8.3f}" if isinstance(x, (int, float)) else f"{'n/a':>8}"

        lines.append(f"{p['shape']:>6} {p['dtype']:>9} {p['tokens']:>6} | {num(g):>10} {num(best)} {pct(best, g)} "
                     f"{num(table_us)} | {num(c):>10} {num(cold)} {pct(cold, c)} {num(table_cold)}")
    if any("error" in (p.get("peer") or {}) for p in points):
        why = next(p["peer"]["error"] for p in points if "error" in (p.get("peer") or {}))
        lines.append(f"store_cache not timed: {why}")
    return lines


# -- the sweep (GPU) -----------------------------------------------------------------------------
def sweep(out_dir: Path) -> None:
    import torch

    import tune_fused as tf_lab
    from kvprof.core.atomic import atomic_write_text
    from kvprof.kvcache.writers import create_writer
    from kvprof.kvcache.writers.card_tables import device_card

    shapes = _env_list("CARDS_SHAPES", "32x128,8x128,1x128", lambda s: tuple(int(v) for v in s.split("x")))
    dtypes = _env_list("CARDS_DTYPES", "bf16,fp8_e4m3", str)
    tokens = _env_list("CARDS_TOKENS", "4096,32768,512,64,8,1", int)
    captures = _env_int("CARDS_CAPTURES", 3, 1)
    cold_mode()  # a misspelt CARDS_COLD fails here, before anything compiles
    budget = _env_int("CARDS_BUDGET_S", 270, 1)
    peer_name = os.environ.get("CARDS_PEER", "sglang_store_cache").strip()
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU (--derive runs anywhere)")
    device = torch.device("cuda")
    card, name, sms = device_card(device)
    label = card or name.replace(" ", "-")
    log(f"{name}, {sms} SMs: card row {card or 'none (the fallback)'}")
    if _env_int("CARDS_PRECOMPILE", 1, 0):
        tf_lab.SHAPES, tf_lab.TOKENS = shapes, tokens
        tf_lab.DTYPES = [(d, "bf16") for d in dtypes]
        tf_lab.precompile()
    peer = None
    if peer_name:
        try:
            peer = create_writer(peer_name)
        except Exception as exc:  # noqa: BLE001  no SGLang here: the comparison says so
            peer = oneline(exc)
    doc: dict[str, Any] = {"device": name, "sms": sms, "card": card, "captures": captures, "peer": peer_name,
                           "grid": {"shapes": [f"{h}x{d}" for h, d in shapes], "dtypes": dtypes, "tokens": tokens},
                           "date": time.strftime("%Y-%m-%d", time.gmtime()), "points": []}
    path = out_dir / f"cards-{label}.json"

    order = [(h, d, dt, t) for (h, d) in shapes for t in tokens for dt in dtypes]
    for heads, dim, dtype, n in order:
        if time.perf_counter() - T0 > budget:
            doc["stopped"] = f"budget of {budget} s spent before {heads}x{dim} {dtype} {n}"
            log(doc["stopped"])
            break
        rec = measure_point(heads, dim, dtype, n, device, card, captures, peer, peer_name)
        doc["points"].append(rec)
        doc["elapsed_s"] = round(time.perf_counter() - T0, 1)
        atomic_write_text(path, json.dumps(doc, indent=1))
        best = rec.get("best", {})
        log(f"{rec['shape']:>6} {rec['dtype']:>13} {n:>6}: pick {'/'.join(map(str, best.get('config', [])))} "
            f"{best.get('us')} / {rec.get('best_cold_us')} µs graph / cold, {rec.get('why')} (table "
            f"{'/'.join(map(str, rec['table']))} {rec.get('table_us')} / {rec.get('table_cold_us')}), "
            f"{peer_name or 'peer'} {rec['peer'].get('graph_us', rec['peer'].get('error'))} / "
            f"{rec['peer'].get('cold_us')}")
        torch.cuda.empty_cache()
    report([doc], card_rows=True)
    log(f"wrote {path}")


def measure_point(heads: int, dim: int, dtype: str, n: int, device: Any, card: str | None, captures: int,
                  peer: Any, peer_name: str) -> dict[str, Any]:
    """One point: every candidate in graphs and (``CARDS_COLD=all``) after an L2 flush, the
    peer in both modes, the pick (:func:`pick_best`) and the table's shape."""
    import tune_fused as tf_lab
    from kvprof.bench.run import BenchCase, BenchPoint
    from kvprof.bench.timing import time_cold, time_graph
    from kvprof.kvcache.writers.triton_fused import TritonConfig, TritonFusedWriter
    from kvprof.kvcache.writers.triton_tables import STORE_TABLES, pick_config

    fp8 = dtype.startswith("fp8")
    point = BenchPoint(heads, dim, dtype, "bf16", n)
    case = BenchCase(point, device, 256 << 20, seed=n)
    row_bytes = 2 * heads * dim * 2
    cands = [TritonConfig(*c) for c in tf_lab.candidates(heads * dim, n, fp8)]
    for row in STORE_TABLES:  # every card row's choice here is timed too
        cfg = pick_config(row_bytes, n, fp8=fp8, card=row)
        if cfg not in cands:
            cands.append(cfg)
    now = pick_config(row_bytes, n, fp8=fp8, card=card)
    rec: dict[str, Any] = {"shape": point.shape, "heads": heads, "dim": dim, "dtype": point.dtype_label,
                           "fp8": fp8, "tokens": n, "writes": case.writes, "candidates": [],
                           "table": [now.block_t, now.num_warps, now.split] + (["stream"] if now.stream else [])}

    def steps(writer: Any) -> Any:
        pool = case.pool(writer.name, writer)

        def step() -> None:
            for loc in case.locs:
                pool.set_kv_buffer(0, loc, case.k, case.v, case.scale, case.scale)

        def one() -> None:
            pool.set_kv_buffer(0, case.locs[0], case.k, case.v, case.scale, case.scale)

        return step, one

    def graph(writer: Any) -> tuple[float, float]:
        step, _ = steps(writer)
        ts = [time_graph(step, case.writes, 100) for _ in range(captures)]
        return statistics.median(t.median_us for t in ts), statistics.median(t.spread_us for t in ts)

    def cold(writer: Any) -> float:
        _, one = steps(writer)
        return round(time_cold(one, 100, device).median_us, 4)

    def writer_of(label: list) -> Any:
        return TritonFusedWriter(config=TritonConfig(*label[:3], "stream" in label))

    cold_all = cold_mode() == "all"
    for cfg in cands:
        lab = [cfg.block_t, cfg.num_warps, cfg.split] + (["stream"] if cfg.stream else [])
        rec["candidates"].append(time_candidate(lab, case, writer_of, graph, cold if cold_all else None))
    rec["peer"] = measure_peer(peer, case, device, graph, cold)
    timed_ok = [c for c in rec["candidates"] if "us" in c]
    if timed_ok:
        rec["best"], rec["why"] = pick_best(timed_ok, rec["peer"])
        rec["fastest"] = min(timed_ok, key=lambda c: c["us"])
        table_rec = next((c for c in timed_ok if c["config"] == rec["table"]), None)
        rec["table_us"] = table_rec["us"] if table_rec else None
        rec.update(cold_pair(rec, table_rec, lambda label: cold(writer_of(label))))
    return rec


def time_candidate(lab: list, case: Any, writer_of: Any, graph: Any, cold: Any) -> dict[str, Any]:
    """One candidate's record: checked against index_put, timed in graphs and (``cold`` not
    None) after a flush; an error in either is recorded, never raised (one bad candidate
    must not lose the run; a failed flush timing keeps the graph time)."""
    try:
        bad = case.check(writer_of(lab))
        if bad:
            return {"config": lab, "error": bad}
        us, iqr = graph(writer_of(lab))
    except Exception as exc:  # noqa: BLE001
        return {"config": lab, "error": oneline(exc)}
    cand = {"config": lab, "us": round(us, 4), "iqr": round(iqr, 4)}
    if cold is not None:
        try:
            cand["cold_us"] = cold(writer_of(lab))
        except Exception as exc:  # noqa: BLE001  the pick is then by graphs
            cand["cold_error"] = oneline(exc)
    return cand


def cold_pair(rec: dict[str, Any], table_rec: dict[str, Any] | None, cold: Any) -> dict[str, Any]:
    """The pick, and the table's shape where it ran, after an L2 flush (timed here unless the
    sweep timed every candidate so)."""
    try:
        best = rec["best"]
        out = {"best_cold_us": best["cold_us"] if "cold_us" in best else cold(best["config"])}
        if table_rec is not None:
            out["table_cold_us"] = table_rec["cold_us"] if "cold_us" in table_rec else cold(rec["table"])
        return out
    except Exception as exc:  # noqa: BLE001
        return {"cold_error": oneline(exc)}


def measure_peer(peer: Any, case: Any, device: Any, graph: Any, cold: Any) -> dict[str, Any]:
    """The peer (a writer, or why there is none) in graph replays and after an L2 flush."""
    if isinstance(peer, str) or peer is None:
        return {"error": peer or "CARDS_PEER is empty"}
    reason = peer.unsupported_reason(device, case.cache, case.inp) or case.check(peer)
    if reason:
        return {"error": reason}
    try:
        g, giqr = graph(peer)
        return {"graph_us": round(g, 4), "iqr": round(giqr, 4), "cold_us": cold(peer)}
    except Exception as exc:  # noqa: BLE001
        return {"error": oneline(exc)}


def report(docs: list[dict], card_rows: bool = False) -> None:
    """Each card's rows and comparison; with several cards, the fallback too."""
    keyed = [{(p["heads"], p["dim"], p["fp8"], p["tokens"]): p for p in d["points"] if "best" in p} for d in docs]
    for doc in docs:
        label = doc.get("card") or doc["device"]
        print(f"\n== {doc['device']} ({doc.get('sms')} SMs), card row {doc.get('card') or 'none'}, {doc.get('date')}, "
              f"{len(doc['points'])} points, {doc.get('captures')} captures each"
              + (f"; {doc['stopped']}" if doc.get("stopped") else ""))
        rows, kept = derive_rows(doc["points"], current_rows(doc.get("card")), doc["grid"]["tokens"])
        print(f"-- STORE_TABLES[{label!r}]: paste into kvprof/kvcache/writers/triton_tables.py")
        for fp8 in (False, True):
            if kept[fp8]:
                print(f"# {'fp8' if fp8 else '16-bit'}: row classes {kept[fp8]} not measured at every grid token "
                      "count: kept from the current row")
            print(rows_source(f"{'FP8' if fp8 else 'B16'}_{label.replace('-', '_').upper()}", rows[fp8]))
        print(f"-- kvprof's best and its table's shape against {doc.get('peer') or 'no peer'} (µs per write; diff: "
              "best vs store_cache, + slower)")
        print("\n".join(comparison(doc["points"])))
    if len(docs) > 1:
        all_points = [p for d in docs for p in d["points"] if "best" in p]
        firsts = {}
        for p in all_points:
            firsts.setdefault((p["heads"], p["dim"], p["fp8"], p["tokens"]), p)
        tokens = sorted(set.intersection(*(set(d["grid"]["tokens"]) for d in docs)))
        rows, kept = derive_rows(list(firsts.values()), current_rows(None), tokens, pick=minimax_pick(keyed))
        names = ", ".join(d.get("card") or d["device"] for d in docs)
        print(f"\n-- STORE_TABLES['fallback']: minimax regret over {names}")
        for fp8 in (False, True):
            if kept[fp8]:
                print(f"# {'fp8' if fp8 else '16-bit'}: row classes {kept[fp8]} kept from the current fallback")
            print(rows_source(f"{'FP8' if fp8 else 'B16'}_FALLBACK", rows[fp8]))


def read_cards(name: str) -> dict:
    """One card's sweep (``cards-*.json``, as written, or gzipped as committed), checked for
    what ``report`` reads."""
    from kvprof.core.files import gunzipped

    try:
        doc = json.loads(gunzipped(Path(name).read_bytes()))
    except (OSError, ValueError) as exc:
        fail(f"cannot read {name}: {oneline(exc)}")
    if not (isinstance(doc, dict) and isinstance(doc.get("points"), list) and isinstance(doc.get("device"), str)
            and isinstance(doc.get("grid"), dict) and isinstance(doc["grid"].get("tokens"), list)
            and all(isinstance(p, dict) for p in doc["points"])):
        fail(f"cannot read {name}: not a tune_cards sweep (needs device, grid.tokens and a points list)")
    return doc


def main(argv: list[str]) -> None:
    if argv[:1] == ["--derive"]:
        if len(argv) < 2:
            fail("--derive needs one or more cards-*.json files")
        report([read_cards(name) for name in argv[1:]])
        return
    if argv:
        fail(f"unknown arguments {' '.join(argv)} (none, or --derive FILE...)")
    out = Path(os.environ.get("OUT", "/tmp/kvprof-gpu"))
    out.mkdir(parents=True, exist_ok=True)
    sweep(out)


if __name__ == "__main__":
    main(sys.argv[1:])
