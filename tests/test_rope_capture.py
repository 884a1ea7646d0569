"""The rope + store writers through the pool, the instrumentation, a CPU capture and its verdict."""

from __future__ import annotations

import gzip

import orjson
import pytest
import torch

from kvprof.analysis.metrics import kernels_verdict, paths_verdict
from kvprof.cli import main
from kvprof.core.vocab import FUSED, ROPE_FUSED, TWO_COPIES
from kvprof.kvcache.instrument import make_pool
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import create_writer, rope_triton_kernel as rk, writer_names
from kvprof.kvcache.writers.rope_reference import cos_sin_table, rope_reference

needs_interpreter = pytest.mark.skipif(rk.triton is None or not rk.interpreted(),
                                       reason="the rope kernel on CPU needs TRITON_INTERPRET=1 at import")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ROPE_VARIANTS = ["rope_then_store", "rope_then_two_stream", "rope_then_triton_fused", "rope_triton_fused"]


def _inputs(tokens=3, hq=4, hk=2, dim=16):
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(tokens, (hq + 2 * hk) * dim, generator=gen).to(torch.bfloat16)
    q, k, v = qkv.split([hq * dim, hk * dim, hk * dim], dim=1)  # 2-D views, as engines pass them
    return q, k, v, torch.tensor([5, 2, 9]), torch.tensor([0, 7, 30]), cos_sin_table(32, dim)


def test_rope_writers_are_mha_writers_of_the_rope_contract():
    from kvprof.kvcache.layouts import get_layout

    names = writer_names("mha")
    assert all(n in names for n in ROPE_VARIANTS)
    for n in ROPE_VARIANTS:
        assert get_layout("mha").contract_of(create_writer(n)) == "rope"
    assert create_writer("rope_then_store", store="two_stream").info().extra["store"] == "two_stream"


@needs_interpreter
def test_pool_rope_write_stores_the_rotated_rows():
    pool = KVPool(12, 1, torch.bfloat16, 2, 16, 2, writer=create_writer("rope_triton_fused"))
    q, k, v, loc, pos, table = _inputs()
    rq, rkey = rope_reference(q.view(3, 4, 16), k.view(3, 2, 16), table, pos, True)
    pool.set_kv_buffer_with_rope(1, loc, q, k, v, pos, table)
    assert torch.equal(q.view(3, 4, 16), rq.to(torch.bfloat16))
    assert torch.equal(k.view(3, 2, 16), rkey.to(torch.bfloat16))
    assert torch.equal(pool.get_key_buffer(1)[loc], k.view(3, 2, 16))
    assert torch.equal(pool.get_value_buffer(1)[loc], v.view(3, 2, 16))
    assert pool.path_counts == {ROPE_FUSED: 1} and not pool.get_key_buffer(0).any()


@needs_interpreter
@pytest.mark.parametrize("case", ["slot past the end", "negative position", "position past the table",
                                  "bad positions dtype", "layer", "store writer", "scale", "v in the V cache"])
def test_pool_rope_refusals_write_and_rotate_nothing(case):
    q, k, v, loc, pos, table = _inputs()
    writer = create_writer("index_put" if case == "store writer" else "rope_then_triton_fused")
    pool = KVPool(12, 1, torch.bfloat16, 2, 16, 2, writer=writer)
    before = [t.clone() for t in (q, k, v)]
    args = dict(layer=0, loc=loc, q=q, k=k, v=v, positions=pos, cos_sin_cache=table)
    args.update({"slot past the end": {"loc": torch.tensor([5, 13, 1])},
                 "negative position": {"positions": torch.tensor([0, -1, 2])},
                 "position past the table": {"positions": torch.tensor([0, 32, 2])},
                 "bad positions dtype": {"positions": pos.float()},
                 "layer": {"layer": 2}, "store writer": {}, "scale": {"k_scale": -1.0},
                 "v in the V cache": {"v": pool.v_buffer[0][4:7]}}[case])
    with pytest.raises(ValueError) as err:
        pool.set_kv_buffer_with_rope(**args)
    assert "\n" not in str(err.value)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))
    assert not any(b.any() for b in pool.k_buffer + pool.v_buffer) and not pool.path_counts


def test_a_rope_pool_refuses_a_plain_store_by_name():
    pool = KVPool(12, 1, torch.bfloat16, 2, 16, 1, writer=create_writer("rope_triton_fused"))
    k = torch.zeros(1, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rotates q and k too: write through set_kv_buffer_with_rope"):
        pool.set_kv_buffer(0, torch.tensor([1]), k, k)


@needs_interpreter
def test_instrumented_rope_write_is_a_set_kv_buffer_range():
    """The rope write is recorded in the range family the analysis attributes writes by."""
    pool = make_pool(12, 1, torch.bfloat16, 2, 16, 2, writer=create_writer("rope_triton_fused"), instrument=True)
    q, k, v, loc, pos, table = _inputs()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pool.set_kv_buffer_with_rope(1, loc, q, k, v, pos, table)
    assert "set_kv_buffer[rope_triton_fused] L1" in {e.name for e in prof.events()}
    with pytest.raises(ValueError, match="not in this pool"):
        pool.set_kv_buffer_with_rope(5, loc, q, k, v, pos, table)
    assert pool.path_counts == {ROPE_FUSED: 1}


def test_verdict_witnesses_of_rope_writes():
    """A write fused into the rotary kernel is one launch (fused); a separate rotary kernel
    before a fused store is judged by the store: two GPU activities per write are fused."""
    import pandas as pd

    assert paths_verdict({ROPE_FUSED: 4}) == (True, []) and paths_verdict({ROPE_FUSED: 2, TWO_COPIES: 2})[0] is False
    w = pd.DataFrame({"gpu_ops": [2, 2], "during_capture": [False, False], "step": [0, 1]})
    assert kernels_verdict(w)[0] is False
    fused, detail = kernels_verdict(w, rope_kernels=1)
    assert fused is True and detail["rope_kernels_per_write"] == 1
    assert kernels_verdict(w.assign(gpu_ops=3), rope_kernels=1)[0] is False
    assert paths_verdict({FUSED: 1})[0] is True


@needs_interpreter
def test_cpu_capture_of_rope_variants_says_fused_into_rope(tmp_path, capsys):
    args = ["capture", "--model", "llama-3.1-70b", "--tp", "8", "--batch-sizes", "2", "--prefill-tokens", "8",
            "--steps", "2", "--warmup", "1", "--no-progress", "--variants", "rope_triton_fused,rope_then_two_stream",
            "--out", str(tmp_path), "--run-id", "r"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())  # as wrapped at any terminal width
    assert "fused into rope (one launch rotates q and k and writes K and V): rope_triton_fused" in out
    run = tmp_path / "r"
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    fused, separate = manifest["variants"]["rope_triton_fused"], manifest["variants"]["rope_then_two_stream"]
    assert fused["rope"] == "fused" and separate["rope"] == "separate"
    assert set(fused["paths"]) == {ROPE_FUSED} and set(separate["paths"]) == {TWO_COPIES}
    # q (8 heads) and k (1) read and written, v read, K and V rows written: bf16, 128 dims
    assert fused["bytes_per_token"] == ((2 * (8 + 1) + 1) * 128 * 2 + 2 * 128 * 2)
    trace = orjson.loads(gzip.decompress((run / fused["files"]["torch_trace"]).read_bytes()))
    assert trace["kvprof"]["rope"] == "fused"
    assert "set_kv_buffer[rope_triton_fused] L0" in {e.get("name") for e in trace["traceEvents"]}
    summary = orjson.loads((run / "summary.json").read_bytes())
    assert summary["variants"]["rope_triton_fused"]["rope"] == "fused"
    assert summary["variants"]["rope_triton_fused"]["fused"] is True


@pytest.mark.slow
def test_rope_variants_run_inside_a_layer_context(tmp_path, capsys):
    """With --context layer a rope writer replaces the layer's rotary and store; the savings
    are measured against two_stream and rope_then_triton_fused."""
    rc = main(["capture", "--model", "tiny=2x1x64", "--tp", "1", "--batch-sizes", "2", "--phase", "decode",
               "--steps", "1", "--warmup", "1", "--reference-steps", "2", "--no-progress", "--context", "layer",
               "--context-len", "8", "--variants", "two_stream,rope_then_triton_fused,rope_triton_fused",
               "--out", str(tmp_path), "--run-id", "l"])
    assert rc == 0, capsys.readouterr().err
    run = tmp_path / "l"
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    assert set(manifest["variants"]["rope_triton_fused"]["paths"]) == {ROPE_FUSED}
    trace = orjson.loads(gzip.decompress((run / "rope_triton_fused.pt.trace.json.gz").read_bytes()))
    assert trace["kvprof"]["context"] == "layer"
    assert "set_kv_buffer[rope_triton_fused] L1" in {e.get("name") for e in trace["traceEvents"]}
    steps = orjson.loads((run / "summary.json").read_bytes())["layer_steps"]
    assert steps["against"] == ["two_stream", "rope_then_triton_fused"]
    assert {(s["variant"], s["against"]) for s in steps["savings"]} == {
        ("rope_triton_fused", "two_stream"), ("rope_triton_fused", "rope_then_triton_fused"),
        ("rope_then_triton_fused", "two_stream")}


needs_compiled = pytest.mark.skipif(rk.triton is None or rk.interpreted(),
                                    reason="GPU tests need the compiled kernel: run with TRITON_INTERPRET=0")


@pytest.mark.gpu
@needs_compiled
@pytest.mark.parametrize("name, kernels", [("rope_triton_fused", 1), ("rope_then_triton_fused", 2)])
def test_gpu_kernels_per_rope_write(name, kernels):
    """One launch for the fused rope write; the rotary kernel plus the store's otherwise
    (what the analysis' kernel witness expects of each)."""
    from torch.autograd import DeviceType

    pool = KVPool(64, 1, torch.bfloat16, 2, 16, 1, "cuda", writer=create_writer(name), check_slots=False)
    q, k, v, loc, pos, table = (t.cuda() for t in _inputs())
    pool.set_kv_buffer_with_rope(0, loc, q, k, v, pos, table)  # compiles
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        pool.set_kv_buffer_with_rope(0, loc, q, k, v, pos, table)
        torch.cuda.synchronize()
    on_gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert len(on_gpu) == kernels, [e.name for e in on_gpu]
