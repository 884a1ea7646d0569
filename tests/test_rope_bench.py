"""``kvprof bench --family rope``: rope + store writes checked against the float32 reference,
timed beside the same rotation followed by a store, with the copy floor of what they move."""

from __future__ import annotations

import orjson
import pytest
import torch

from kvprof.bench.render import ROPE_EXTRA_COLUMNS, table_columns, verdict_lines
from kvprof.bench.run import BenchPoint, RopeBenchCase, rope_grid, run_bench
from kvprof.cli import main
from kvprof.core.bench_result import BenchResult, BenchRow
from kvprof.kvcache.writers import rope_triton_kernel as rk
from kvprof.kvcache.writers.rope_triton import RopeTritonFusedWriter

needs_interpreter = pytest.mark.skipif(rk.triton is None or not rk.interpreted(),
                                       reason="the rope kernel on CPU needs TRITON_INTERPRET=1 at import")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_a_rope_point_moves_q_and_k_twice_v_once_and_two_cache_rows():
    p = BenchPoint(1, 128, "fp8_e4m3", "bf16", 4, q_heads=8)
    # q (8 heads) and k (1) read and written back, v read, in bf16; K and V rows of fp8
    assert p.bytes_moved() == 4 * (2 * (8 + 1) * 128 * 2 + 128 * 2 + 2 * 128 * 1)
    assert p.shape == "8x1x128" and BenchPoint(1, 128, "bf16", "bf16", 4).shape == "1x128"
    row = BenchRow(1, 128, "bf16", "bf16", 4, "rope_triton_fused", "graph", "ok", q_heads=8)
    back = BenchRow.from_json(orjson.loads(orjson.dumps(row.to_json())))
    assert back.q_heads == 8 and back.shape == "8x1x128" and back.key == row.key
    assert BenchRow.from_json({"shape": "8x1x128", "dtype": "bf16", "tokens": 1}).heads == 1  # from the label alone


class SkipsTheRotation(RopeTritonFusedWriter):
    """Stores k without rotating anything: fast, and wrong."""

    name = "skips_rotation"

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None) -> str:
        k_buf[loc] = k.to(k_buf.dtype)
        v_buf[loc] = v.to(v_buf.dtype)
        return "fused_into_rope"


def make_skipper() -> SkipsTheRotation:
    return SkipsTheRotation()


@pytest.mark.slow  # ~5 s: three writers, each checked, warmed up and timed under the interpreter
@needs_interpreter
def test_rope_bench_checks_times_and_judges(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "skipper_mod", types.SimpleNamespace(make=make_skipper))
    points = rope_grid([(2, 1, 16)], [("fp8_e4m3", "bf16")], [3])
    result = run_bench(points, ["index_put", "rope_then_triton_fused", "rope_triton_fused", "skipper_mod:make"],
                       torch.device("cpu"), eager_repeats=1)
    by = {(r.variant, r.dtype.split("<-")[-1]): r for r in result.records}
    assert by[("rope_triton_fused", "bf16")].ok and by[("rope_then_triton_fused", "bf16")].ok
    assert set(by[("rope_triton_fused", "bf16")].paths) == {"fused_into_rope"}
    assert set(by[("rope_then_triton_fused", "bf16")].paths) == {"fused"}  # the store's path
    wrong = by[("skipper_mod:make", "bf16")]
    assert wrong.status == "wrong" and "q differs from the float32 reference" in wrong.reason
    store_only = by[("index_put", "bf16")]
    assert store_only.status == "unavailable" and "rope + store writers" in store_only.reason
    fused = by[("rope_triton_fused", "bf16")]
    assert fused.bytes == points[0].bytes_moved() and "rope_then_triton_fused" in fused.ratio_to
    headers = [c.header for c in table_columns(result, "eager", "median_us", "iqr_us")]
    assert headers[-len(ROPE_EXTRA_COLUMNS):] == list(ROPE_EXTRA_COLUMNS)
    lines = verdict_lines(result)
    # the target is a GPU's (graph replays): a CPU run is not judged against it
    assert not any(line.startswith("rope_triton_fused: target met at") for line in lines)
    from kvprof.bench.run import rope_verdicts

    assert rope_verdicts(result, "rope_triton_fused")["target"]["points"] == 1  # computed all the same
    assert any("than rope_then_triton_fused at" in line for line in lines)
    assert BenchResult.from_json(orjson.loads(result.dumps())).records[0].q_heads == 2


def test_a_store_bench_refuses_rope_writers_by_family():
    from kvprof.bench.run import grid
    from kvprof.commands import bench, command_flags

    # the reason names the setting as kvprof bench's flag (by its field without names)
    result = run_bench(grid([(1, 16)], [("bf16", "bf16")], [2]), ["index_put", "rope_triton_fused"],
                       torch.device("cpu"), eager_repeats=1, names=command_flags(bench.add_arguments))
    rope = next(r for r in result.records if r.variant == "rope_triton_fused")
    assert rope.status == "unavailable" and rope.reason.endswith("time it with kvprof bench --family rope")


@needs_interpreter
def test_rope_case_check_holds_the_reference_fixed():
    """The check rotates copies: the timed inputs stay as they were built."""
    case = RopeBenchCase(BenchPoint(1, 16, "bf16", "bf16", 2, q_heads=2), torch.device("cpu"), 1 << 20, 0)
    before = case.qkv.clone()
    assert case.check(RopeTritonFusedWriter()) is None
    assert torch.equal(case.qkv, before)


@pytest.mark.parametrize("args, message", [
    (["--family", "rope", "--shapes", "1x128"], "--family rope takes --shapes QHEADSxHEADSxDIM"),
    (["--shapes", "8x1x128"], "QHEADSxHEADSxDIM is for --family rope"),
    (["--family", "rope", "--shapes", "8x1x128,1x128"], "expected HEADSxDIM"),
])
def test_bench_family_shapes_are_one_line_errors(tmp_path, capsys, args, message):
    try:
        rc = main(["bench", *args, "--out", str(tmp_path / "out")])
    except SystemExit as exc:  # argparse's own refusal
        rc = exc.code
    assert rc != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_bench_check_allows_one_ulp_of_the_output_dtype_and_no_more():
    """A kernel contracted into FMAs (SGLang's) rounds within one ulp: a result, not wrong."""
    from kvprof.bench.run import _beyond_one_ulp

    ref = torch.tensor([[[1.0, -3.0, 0.15625]]])
    got = ref.to(torch.bfloat16)
    one_up = (got.view(torch.int16) + 1).view(torch.bfloat16)
    two_up = (got.view(torch.int16) + 2).view(torch.bfloat16)
    tiny = torch.zeros_like(ref)  # no cancellation slack
    assert _beyond_one_ulp(got, ref, tiny) == 0 and _beyond_one_ulp(one_up, ref, tiny) == 0
    assert _beyond_one_ulp(two_up, ref, tiny) == 1
