"""lab/tune_cards.py: the rows it derives from measurements, the fallback across cards, and one
point of its sweep run end to end on a CPU (interpreted kernels, stand-in timings)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

LAB = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tc(monkeypatch):
    import kvprof.kvcache.writers.triton_fused  # noqa: F401  (decorated under the interpreter before the script's import)

    monkeypatch.syspath_prepend(str(LAB))
    before = os.environ.get("TRITON_INTERPRET")
    mod = importlib.import_module("tune_cards")
    importlib.import_module("tune_fused")  # both set TRITON_INTERPRET=0 for a GPU run: put it back
    if before is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = before
    return mod


def point(heads, tokens, fp8, timings: dict[tuple, float]):
    cands = [{"config": list(c[:3]) + (["stream"] if c[3] else []), "us": us} for c, us in timings.items()]
    best = min(cands, key=lambda c: c["us"])
    return {"shape": f"{heads}x128", "heads": heads, "dim": 128, "dtype": "fp8_e4m3<-bf16" if fp8 else "bf16",
            "fp8": fp8, "tokens": tokens, "candidates": cands, "best": best, "table": best["config"],
            "best_cold_us": best["us"] * 2}


A, B, C = (1, 4, 1, False), (2, 8, 1, False), (1, 8, 4, True)


def test_rows_one_per_grid_token_count_merged_and_unmeasured_classes_kept(tc):
    pts = [point(32, 512, False, {A: 1.0, B: 2.0}), point(32, 4096, False, {A: 1.0, B: 2.0}),
           point(32, 32768, False, {A: 3.0, B: 2.0}), point(8, 512, False, {A: 1.0})]  # 8x128 incomplete
    current = {False: [(8192, tc.ANY, (9, 9, 1, False)), (tc.ANY, tc.ANY, (7, 7, 1, False))], True: []}
    rows, kept = tc.derive_rows(pts, current, [512, 4096, 32768])
    assert rows[False] == [(8192, tc.ANY, (9, 9, 1, False)), (tc.ANY, 4096, A), (tc.ANY, tc.ANY, B)]
    assert kept[False] == [8192]
    src = tc.rows_source("B16_X", rows[False])
    assert "(_ANY, 4096, TritonConfig(1, 4))," in src and "(_ANY, _ANY, TritonConfig(2, 8))," in src
    exec(src.replace(": Table", ""), {"_ANY": tc.ANY, "TritonConfig": lambda *a, **k: (a, k)})  # valid Python


def test_the_fallback_is_the_shape_with_the_smallest_worst_slowdown_over_the_cards(tc):
    # card 1: A best, C +5 %, B +30 %; card 2: B best, C +4 %, A +40 %: the fallback is C
    p1 = point(32, 4096, True, {A: 1.00, B: 1.30, C: 1.05})
    p2 = point(32, 4096, True, {A: 1.40, B: 1.00, C: 1.04})
    key = (32, 128, True, 4096)
    pick = tc.minimax_pick([{key: p1}, {key: p2}])
    assert pick(p1) == C
    assert tc.derive_rows([p1], {False: [], True: []}, [4096], pick=pick)[0][True] == [(tc.ANY, tc.ANY, C)]


def test_the_pick_weighs_both_modes_and_prefers_shapes_at_or_below_the_peer(tc):
    # A fastest in graphs but slowest from DRAM; B a little slower in graphs, fastest cold
    cands = [{"config": [1, 8, 4], "us": 1.30, "cold_us": 2.66}, {"config": [1, 2, 4], "us": 1.38, "cold_us": 2.50},
             {"config": [1, 4, 1], "us": 1.55, "cold_us": 2.52}]
    best, why = tc.pick_best(cands, {"graph_us": 1.68, "cold_us": 2.56})
    assert best["config"] == [1, 2, 4] and why.startswith("at or below the peer")
    # no candidate at or below the peer after a flush: least regret over both modes
    best, why = tc.pick_best(cands, {"graph_us": 1.68, "cold_us": 2.40})
    assert best["config"] == [1, 2, 4] and why == "least regret over both modes"
    # the peer's bound rules out the least-regret shape where another meets it
    best, _ = tc.pick_best(cands, {"graph_us": 1.34, "cold_us": 2.70})
    assert best["config"] == [1, 8, 4]
    # without after-flush times (CARDS_COLD=best, older JSON): the graphs' fastest
    best, why = tc.pick_best([{k: v for k, v in c.items() if k != "cold_us"} for c in cands], {})
    assert best["config"] == [1, 8, 4] and why == "fastest in graphs"


def test_the_fallback_weighs_the_flush_where_every_card_timed_it(tc):
    # card 1: A and C equal in graphs, C 30 % slower after a flush; card 2 (older JSON, graphs only): C best
    p1 = point(32, 64, False, {A: 1.00, C: 1.00, B: 1.10})
    for c, cold in zip(p1["candidates"], (2.0, 2.6, 2.0)):
        c["cold_us"] = cold
    p2 = point(32, 64, False, {A: 1.05, C: 1.00, B: 1.04})
    key = (32, 128, False, 64)
    # by graphs alone C (worst 1.00) would win; with card 1's flush times C's worst is 1.30, A's 1.05, B's 1.10
    assert tc.minimax_pick([{key: p1}, {key: p2}])(p1) == A


def test_derive_prints_every_card_and_the_fallback(tc, tmp_path):
    docs = []
    for card, t in (("H200", {A: 1.0, B: 1.2}), ("H100-SXM", {A: 1.3, B: 1.0})):
        doc = {"device": f"NVIDIA {card}", "sms": 132, "card": card, "captures": 3, "peer": "sglang_store_cache",
               "date": "2026-12-06", "grid": {"tokens": [4096]},
               "points": [point(32, 4096, False, t), point(32, 4096, True, t)]}
        doc["points"][0]["peer"] = {"graph_us": 1.1, "cold_us": 2.0}
        (tmp_path / f"{card}.json").write_text(json.dumps(doc))
        docs.append(str(tmp_path / f"{card}.json"))
    r = subprocess.run([sys.executable, str(LAB / "tune_cards.py"), "--derive", *docs], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "STORE_TABLES['H200']" in r.stdout and "STORE_TABLES['H100-SXM']" in r.stdout
    assert "minimax regret over H200, H100-SXM" in r.stdout
    assert " -9.1%" in r.stdout  # H200's best 1.0 against store_cache's 1.1
    assert "kept from the current row" in r.stdout  # the grid had 32x128 only


def test_the_committed_h100_sweeps_give_the_h100_store_rows(tc, capsys):
    """The H100-SXM store row is what --derive makes of the sweeps SOURCES names (gzipped as
    committed): the 8x128 and 32x128 classes from one, the 1x128 class from the other, each
    keeping the classes it did not measure; a row edited without a sweep fails here."""
    from kvprof.kvcache.writers import triton_tables

    results = LAB / "results"
    committed = tc.current_rows("H100-SXM")
    measured: set[int] = set()
    for sweep in ("h100-2026-12-07f/a-order-tune", "h100-2026-12-07g/c-tune-1x128"):
        path = results / sweep / "cards-H100-SXM.json.gz"
        assert str(path.relative_to(LAB.parent)) in triton_tables.SOURCES["H100-SXM"]
        doc = tc.read_cards(str(path))
        rows, kept = tc.derive_rows(doc["points"], committed, doc["grid"]["tokens"])
        assert rows == committed, sweep
        measured |= {cls for cls, _, _ in committed[False]} - set(kept[False])
    assert measured == {cls for cls, _, _ in committed[False]}  # every class from a sweep, none only kept
    tc.report([tc.read_cards(str(results / "h100-2026-12-07f/a-order-tune/cards-H100-SXM.json.gz"))])
    assert "B16_H100_SXM: Table = [" in capsys.readouterr().out


@pytest.mark.parametrize("args, env, words", [
    (["--derive"], {}, "--derive needs one or more"),
    (["--derive", "/nonexistent.json"], {}, "cannot read /nonexistent.json"),
    (["--derive", str(LAB / "README.md")], {}, "README.md: JSONDecodeError"),
    (["--derive", str(LAB / "results" / "layer.txt.gz")], {}, "layer.txt.gz: "),
    (["--derive", str(LAB / "results" / "h100-2026-12-07f" / "a-order-tune" / "rope-order-4096.json")], {},
     "not a tune_cards sweep"),
    ([], {"CARDS_CAPTURES": "x"}, "CARDS_CAPTURES must be an integer"),
    ([], {"CARDS_TOKENS": "1,x"}, "cannot read CARDS_TOKENS"),
    ([], {"CARDS_COLD": "some"}, "CARDS_COLD must be all or best, got 'some'"),
    (["--what"], {}, "unknown arguments --what"),
])
def test_a_bad_setting_is_one_line(args, env, words):
    r = subprocess.run([sys.executable, str(LAB / "tune_cards.py"), *args], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=120)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr


def test_one_point_of_the_sweep_end_to_end_on_a_cpu(tc, monkeypatch):
    """The sweep's point: candidates checked and timed, the fastest picked, the table's shape
    and the peer timed, cold timings taken (the timings are stand-ins: no GPU here)."""
    from kvprof.bench import timing
    from kvprof.kvcache.writers.triton_convert import triton

    if triton is None:
        pytest.skip("triton not importable")
    seen = []

    def fake_graph(fn, writes, replays, warmup=10):
        fn()
        seen.append(writes)
        return timing.Timing(1.0 + len(seen) / 100, replays, 0.01)

    monkeypatch.setattr(timing, "time_graph", fake_graph)
    monkeypatch.setattr(timing, "time_cold", lambda fn, replays, device: (fn(), timing.Timing(3.0, replays, 0.1))[1])
    from kvprof.kvcache.writers import create_writer

    rec = tc.measure_point(1, 128, "bf16", 1, torch.device("cpu"), None, 1, create_writer("index_put"), "index_put")
    ok = [c for c in rec["candidates"] if "us" in c]
    assert ok and all(c["cold_us"] == 3.0 for c in ok)  # every candidate timed after a flush too
    assert rec["fastest"] == ok[0] and rec["best"] == ok[0] and rec["best_cold_us"] == 3.0  # equal cold: graphs decide
    assert rec["table"] in [c["config"] for c in rec["candidates"]]
    assert rec["peer"] == {"graph_us": pytest.approx(1.0 + len(seen) / 100, abs=1e-3), "iqr": 0.01, "cold_us": 3.0}
