"""Hypothesis over hostile input to the sidecar reader, kernel-name
matching, the plugin's graph records matched to replays (against a brute-force reference), the
Perfetto export's names and lanes, output paths, the command nsys is given, the run folder's
non-regular entries, and smoke cases over the writers, scrub and the gate through their public
entry points (a traceback or a hang is the only failure there).

Derandomized, EXAMPLES per property in CI (``KVPROF_FUZZ_EXAMPLES=N`` for a long random run);
the properties that run a command take a fifth of that. Count: see docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.core.errors import KvprofError, TraceError, UsageError
from kvprof.core.sidecar import (
    KERNEL_NAME_PATTERN,
    MAX_COUNT,
    MAX_NAME,
    SIDECAR_SCHEMA,
    Sidecar,
    decode_sidecar,
    kernel_matches,
)
from kvprof.core.text import printable

LONG = int(os.environ.get("KVPROF_FUZZ_EXAMPLES", "0"))
EXAMPLES = LONG or 80
SLOW_EXAMPLES = LONG or 20
FAST = settings(max_examples=EXAMPLES, derandomize=not LONG, deadline=None,
                suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=SLOW_EXAMPLES, derandomize=not LONG, deadline=None,
                suppress_health_check=list(HealthCheck))
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")

# ---------------------------------------------------------------- the sidecar reader

INTS = st.one_of(st.integers(-(1 << 70), 1 << 70), st.sampled_from([-1, 0, 1, MAX_COUNT, MAX_COUNT + 1, 1 << 63,
                                                                    (1 << 63) - 1, 1 << 64, -(1 << 63)]))
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", "x" * (MAX_NAME + 1), "a\x00b", "\x1b[2J", "a b",
                                                        "store_kvcache_kernel", "ns::k", "k<1>"]))
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False), TEXT),
                       lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(TEXT, c, max_size=3)),
                       max_leaves=8)
FIELDS = ["pid", "rank", "tp_rank", "tp_size", "writer", "paths", "fallbacks", "write_paths", "graphs",
          "graphs_without_writes", "pools", "device", "hooked", "unattributed", "schema"]
WRITE_FIELDS = ["layer", "variant", "path", "tokens", "kernel", "kernels"]


def _valid_doc() -> dict[str, Any]:
    return {"schema": SIDECAR_SCHEMA, "pid": 7, "tp_rank": 0, "writer": "triton_fused",
            "paths": {"sglang:sglang_mha": 4, "sglang:fallback": 2}, "fallbacks": {"dtype": 2},
            "pools": [{"class": "MHATokenToKVPool", "variant": "sglang_mha", "native_path": "store_cache",
                       "layer_num": 2}],
            "graphs": [{"graph": 0, "writes": [{"layer": 0, "variant": "sglang_mha", "path": "sglang:sglang_mha",
                                                "tokens": 8, "kernel": "store_kvcache_kernel", "kernels": 1}]}]}


def _check_invariants(sc: Sidecar) -> None:
    """What a Sidecar the reader returns guarantees to every later reader."""
    counts = [*sc.paths.values(), *sc.fallbacks.values(), *sc.unattributed.values(), *(sc.write_paths or {}).values(),
              sc.graphs_without_writes]
    assert all(0 <= c <= MAX_COUNT for c in counts)
    assert sum(sc.fallbacks.values()) <= sc.paths.get("sglang:fallback", 0)
    assert sc.pid is None or 0 <= sc.pid < 1 << 63
    for g in sc.graphs or []:
        assert 0 <= g.graph < 1 << 63
        for w in g.writes:
            assert -1 <= w.layer <= MAX_COUNT and 0 <= w.tokens <= MAX_COUNT and 1 <= w.kernels <= MAX_COUNT
            assert len(w.variant) <= MAX_NAME and len(w.path) <= MAX_NAME
            assert w.kernel is None or re.fullmatch(KERNEL_NAME_PATTERN, w.kernel)
    assert all(len(k) <= MAX_NAME for k in sc.paths)


@FAST
@given(field=st.sampled_from(FIELDS), value=JSONISH)
def test_any_value_in_any_sidecar_field_is_read_within_bounds_or_refused(field: str, value: Any) -> None:
    doc = _valid_doc()
    doc[field] = value
    try:
        sc = decode_sidecar(json.dumps(doc).encode(), "s.json")
    except TraceError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("s.json: ")
        return
    _check_invariants(sc)


@FAST
@given(field=st.sampled_from(WRITE_FIELDS), value=JSONISH)
def test_any_value_in_a_graph_write_is_read_within_bounds_or_refused(field: str, value: Any) -> None:
    doc = _valid_doc()
    doc["graphs"][0]["writes"][0][field] = value
    try:
        sc = decode_sidecar(json.dumps(doc).encode(), "s.json")
    except TraceError:
        return
    _check_invariants(sc)


@FAST
@given(raw=st.one_of(st.binary(max_size=200),
                     st.integers(1, 200_000).map(lambda n: b'{"schema": "kvprof.sglang_sidecar/1", "x": '
                                                 + b"[" * n + b"]" * n + b"}"),
                     st.integers(1, 200_000).map(lambda n: b"{" * n)))
def test_any_bytes_are_a_sidecar_or_one_line(raw: bytes) -> None:
    try:
        _check_invariants(decode_sidecar(raw, "s.json"))
    except TraceError as exc:
        assert "\n" not in str(exc)


# ---------------------------------------------------------------- kernel names

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
QUALIFIED = st.lists(IDENT, min_size=1, max_size=3).map("::".join)


def _tail_match(ident: str, r: str) -> bool:
    """The rule for one qualified identifier: a ``::`` tail of it is ``r``, or ``r`` then ``_`` and more."""
    parts = ident.split("::")
    for i in range(len(parts)):
        tail = "::".join(parts[i:])
        if tail == r or tail.startswith(r + "_") and "::" not in tail[len(r):]:
            return True
    return False


@FAST
@given(recorded=st.sets(QUALIFIED, min_size=1, max_size=4),
       pieces=st.lists(st.one_of(QUALIFIED, st.sampled_from([" ", "<", ">", "(", ")", ", ", "::", "_", "x"])),
                       max_size=10))
def test_kernel_matches_is_the_whole_identifier_rule(recorded: set[str], pieces: list[str]) -> None:
    extra = sorted(recorded)[0]
    name = "".join(pieces) + " " + extra + ("_0d1d" if len(pieces) % 2 else "")
    got = kernel_matches(name, recorded)
    assert got == {r for r in recorded if _tail_match_any(name, r)}
    assert extra in got


def _tail_match_any(name: str, r: str) -> bool:
    return any(_tail_match(m.group(), r) for m in re.finditer(r"[A-Za-z0-9_]+(?:::[A-Za-z0-9_]+)*", name))


@FAST
@given(recorded=st.sets(IDENT, min_size=1, max_size=4), inner=IDENT, left=st.sampled_from("abcXYZ019"),
       right=st.sampled_from("abcXYZ019"))
def test_a_recorded_name_inside_a_longer_word_never_matches(recorded: set[str], inner: str, left: str,
                                                            right: str) -> None:
    r = sorted(recorded)[0]
    word = left + r + right  # glued on both sides: part of another identifier
    assert r not in kernel_matches(f"void {word}<1>(int)", {r})


# ---------------------------------------------------------------- graph records x replays


@SLOW
@given(layers=st.integers(1, 4), graphs=st.dictionaries(st.integers(0, 5), st.integers(1, 64), min_size=1,
                                                        max_size=4),
       replays=st.lists(st.integers(0, 6), min_size=1, max_size=5), ranges=st.booleans(),
       drop=st.dictionaries(st.integers(0, 4), st.lists(st.integers(0, 3), max_size=2), max_size=2),
       names=st.lists(st.sampled_from(["store_kvcache_kernel", "sglang::store_kvcache_kernel", "store",
                                       "nvjet_hsh", "hsh"]), min_size=1, max_size=6))
def test_replays_tie_as_the_per_graph_reference_does(tmp_path_factory: pytest.TempPathFactory, layers: int,
                                                     graphs: dict[int, int], replays: list[int], ranges: bool,
                                                     drop: dict[int, list[int]], names: list[str]) -> None:
    """Each replay ends tied exactly when one recorded graph (or several with the same writes) has
    its kernel sequence: what trying every graph per replay gives, computed here from the spec."""
    from kvprof.core.sidecar import CapturedGraph, GraphWrite, SidecarPool, encode_sidecar
    from kvprof.trace.load import load
    from kvprof.trace.synthetic import EngineReplaySpec, build_engine, dumps

    replays = [r for r in replays if r in graphs] or [next(iter(graphs))]
    spec = EngineReplaySpec(layers=list(range(layers)), graphs=graphs, replays=replays, replay_ranges=ranges,
                            drop=drop)
    run = tmp_path_factory.mktemp("e")
    doc, _ = build_engine(spec)
    (run / "1-TP-0.trace.json").write_bytes(dumps(doc))
    rec = [CapturedGraph(graph=g, writes=[GraphWrite(layer=layer, variant="v", path="sglang:v", tokens=bs,
                                                     kernel=names[(g + layer) % len(names)])
                                          for layer in spec.layers]) for g, bs in graphs.items()]
    side = Sidecar(schema=SIDECAR_SCHEMA, pid=spec.pid, graphs=rec,
                   pools=[SidecarPool(variant="v", native_path="store_cache")], paths={"sglang:v": 1})
    (run / "kvprof-sglang.TP-0.pid-1584.json").write_bytes(encode_sidecar(side))
    (t,) = load(run).traces
    # the reference: a replay's trace kernels, per layer GEMM, store kernel (unless dropped), attention
    from kvprof.trace.synthetic import ENGINE_ATTENTION, ENGINE_GEMM, SGLANG_STORE_KERNEL

    expected = 0
    for i, g in enumerate(replays):
        kept = [layer for layer in spec.layers if layer not in drop.get(i, [])]
        trace_names = [n for layer in spec.layers
                       for n in ([ENGINE_GEMM] + ([SGLANG_STORE_KERNEL] if layer in kept else []) + [ENGINE_ATTENTION])]
        cands = [c for c in rec if not ranges or c.graph == g]
        fits = []
        for c in cands:
            want = {w.kernel for w in c.writes}
            hits = [n for n in trace_names if kernel_matches(n, want)]
            seq = [w.kernel for w in c.writes]
            if len(hits) == len(seq) and all(w in kernel_matches(h, want) for h, w in zip(hits, seq)):
                fits.append(c)
        orders = {tuple((w.layer, w.variant, w.path) for w in c.writes) for c in fits}
        if fits and len(orders) == 1:
            expected += len(fits[0].writes)
    assert len(t.writes) == expected


# ---------------------------------------------------------------- Perfetto names and lanes

ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["\x00", "a\x00b", "\x1b]0;t\x07", "\u202e", "\r\n", "\x9b31m"])


@FAST
@given(names=st.lists(ANY_TEXT, min_size=1, max_size=6), args=st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=3))
def test_perfetto_names_and_arguments_are_inert_and_kept(tmp_path_factory: pytest.TempPathFactory, names: list[str],
                                                         args: dict[str, str]) -> None:
    pytest.importorskip("perfetto")
    from kvprof.report.perfetto import PerfettoWriter, _Slice, read_perfetto

    w = PerfettoWriter()
    parent = w.track(names[0], description=names[-1])
    w.slices(names[0], parent, [_Slice(i, i + 5, n, dict(args)) for i, n in enumerate(names)], rank=1)
    out = tmp_path_factory.mktemp("p") / "x.pftrace"
    w.write(out)
    trace = read_perfetto(out.read_bytes())
    shown = {e.name for p in trace.packet for e in p.interned_data.event_names}
    assert shown == {printable(n) for n in names}  # every name kept, as its escapes
    strings = [a.string_value for p in trace.packet if p.HasField("track_event")
               for a in p.track_event.debug_annotations]
    tracks = [p.track_descriptor.name for p in trace.packet if p.HasField("track_descriptor")]
    assert not any(UNSAFE.search(s) for s in [*shown, *strings, *tracks])


@FAST
@given(spans=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3_000)), max_size=80))
def test_lanes_never_overlap_and_use_the_fewest(spans: list[tuple[int, int]]) -> None:
    from kvprof.report.perfetto import _Slice, lanes

    slices = [_Slice(a, a + d, str(i)) for i, (a, d) in enumerate(spans)]
    got = lanes(slices)
    for lane in got:
        assert all(a.end <= b.start for a, b in zip(lane, lane[1:]))
    points = sorted([(s.start, 1) for s in slices if s.end > s.start] + [(s.end, -1) for s in slices
                                                                          if s.end > s.start])
    depth = best = 0
    for _, step in points:
        depth += step
        best = max(best, depth)
    zero = any(s.end == s.start for s in slices)
    assert len(got) <= max(best, 1 if zero else 0) + (1 if zero else 0)


# ---------------------------------------------------------------- output paths and nsys's command


@FAST
@given(text=st.one_of(st.text(max_size=40), st.integers(1, 5000).map(lambda n: "n" * n),
                      st.integers(1, 400).map(lambda n: "/".join(["d"] * n) + "/x")))
def test_an_output_file_path_is_taken_or_refused_in_one_line(text: str) -> None:
    from kvprof.commands.argtypes import output_file

    try:
        p = output_file(text)
    except argparse.ArgumentTypeError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(p, Path)
    full = Path(os.path.abspath(os.path.expanduser(text)))
    assert all(len(os.fsencode(part)) <= 255 for part in full.parts)


@FAST
@given(argv=st.lists(st.text(max_size=12), max_size=4))
def test_the_profiled_command_is_refused_exactly_when_nsys_would_read_it(argv: list[str]) -> None:
    from kvprof.tools.nsys import check_profiled_command, nsys_profile_command

    bad = not argv or not argv[0] or argv[0].startswith("-")
    try:
        check_profiled_command(argv)
    except UsageError as exc:
        assert bad and "\n" not in str(exc)
        with pytest.raises(UsageError):
            nsys_profile_command("/bin/nsys", "/tmp/x", argv)
        return
    assert not bad
    cmd = nsys_profile_command("/bin/nsys", "/tmp/x", argv)
    assert cmd[-len(argv):] == argv and cmd[-len(argv) - 1].startswith("--output=")


# ---------------------------------------------------------------- smoke: writers, scrub, the gate


@SLOW
@given(name=st.one_of(st.text(max_size=20), st.sampled_from(["index_put", "triton_fused", "rope_then_index_put",
                                                              "", "\x00", "../x"])),
       options=st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(), st.none()),
                               max_size=2))
def test_smoke_any_writer_name_and_options_build_or_refuse(name: str, options: dict[str, Any]) -> None:
    from kvprof.kvcache.writers import create_writer

    try:
        create_writer(name, **options)
    except (KvprofError, ValueError, TypeError) as exc:
        assert str(exc)


@SLOW
@given(data=st.one_of(st.binary(max_size=300), JSONISH.map(lambda v: json.dumps(v).encode())),
       suffix=st.sampled_from([".json", ".json.gz", ".log", ".csv", ".sqlite", ".parquet", ".nsys-rep", ".bin"]))
def test_smoke_scrub_check_of_any_bytes_is_a_code_and_lines(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                                            suffix: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kvprof.cli import main

    d = tmp_path_factory.mktemp("s")
    (d / f"f{suffix}").write_bytes(data)
    rc = main(["scrub", "--check", str(d / f"f{suffix}")])
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2, 3) and "Traceback" not in out + err


@SLOW
@given(doc=JSONISH)
def test_smoke_the_gate_given_any_summary_is_a_code_and_a_line(tmp_path_factory: pytest.TempPathFactory, doc: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from kvprof.cli import main

    d = tmp_path_factory.mktemp("g")
    (d / "a").mkdir()
    (d / "a" / "summary.json").write_text(json.dumps(doc))
    try:
        rc = main(["compare", str(d / "a"), str(d / "a"), "--fail-if-slower", "5", "--no-files"])
    except SystemExit as exc:  # an option this version does not have: argparse's line
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2, 3) and "Traceback" not in out + err
