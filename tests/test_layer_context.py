"""``--context layer`` as an engine builds the layer: views of the QKV output, the rotary in
place, rope writers instead of rotary + store, SGLang's decode attention layout, and the
step savings the analysis derives from the reference pass's step timings."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import tempfile
from pathlib import Path

import orjson
import pytest
import torch

from kvprof.analysis.layer_step import LayerSteps, WriteBoundary, gap_notes, step_savings, write_boundaries
from kvprof.analysis.writes import gpu_work_rows, per_write_table
from kvprof.capture.config import CaptureConfig
from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import CapturePlan, resolve
from kvprof.cli import main
from kvprof.core.layer_kernels import SGLANG_DECODE, TORCH_ROTARY, TORCH_SDPA
from kvprof.core.timings import StepSamples, StepTimings
from kvprof.kvcache.contracts import KVWriter
from kvprof.kvcache.layer import LLAMA31_ROPE, DecoderContext, Rotary, cos_sin_cache, inv_freq, split_qkv
from kvprof.kvcache.writers import create_writer
from kvprof.kvcache.writers.rope_reference import rope_reference
from kvprof.kvcache.writers.rope_triton import RopeThenStoreWriter, RopeTritonFusedWriter
from kvprof.kvcache.writers.sgl_cubin import plan_launch
from kvprof.trace.attribution import attribute
from kvprof.trace.kineto import read_kineto
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build
from kvprof.trace.table import to_frame

CPU = torch.device("cpu")
SMALL = "small=2x2x128"  # 2 layers, 2 KV heads of 128 (q heads = KV heads)


def _config(**kw: object) -> CapturePlan:
    config = CaptureConfig(model=SMALL, tp=1, variants=["index_put"], phases=["decode"], decode_sizes=[8], steps=2,
                           warmup=0, device="cpu", context="layer", context_len=16, **kw)  # type: ignore[arg-type]
    return resolve(config, CPU)


def _context(config: CapturePlan) -> DecoderContext:
    return DecoderContext(config.shape, torch.bfloat16, CPU, config.context_len, seed=config.seed)


class RecordingStore(KVWriter):
    """index_put's store, keeping the K and V tensors the pool handed it."""

    name = "recording_store"

    def __init__(self) -> None:
        self.inner = create_writer("index_put")
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        self.seen.append((cache_k, cache_v))
        return self.inner.write(k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale)


def _layer_output(writer, config: CapturePlan, context: DecoderContext) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One decode step of the session's layers in ``layer`` mode: its output and the K cache."""
    with session_for(config, writer, CPU, instrument=False, context=context) as session:
        prepared = session.prepare(session.phases[0], 0)
        loc = prepared.locs[0]
        session.before_step(prepared, loc, "layer")
        out = session.layer_step(prepared, loc, "layer")
        return out, [b.clone() for b in session.pool.k_buffer]


def test_the_store_gets_k_and_v_as_views_of_the_qkv_output():
    """The rotary runs in place, so K (like V) is a view of the QKV GEMM's output: one
    storage holding exactly that output, q's heads first. Before, K was the rotary's new
    tensor and sgl-kernel's store refused K and V of different strides (two copies)."""
    config = _config()
    store = RecordingStore()
    _layer_output(store, config, _context(config))
    s = config.shape
    width = (s.q_head_num + 2 * s.head_num) * s.head_dim
    assert len(store.seen) == s.layers
    for k, v in store.seen:
        storage = k.untyped_storage()
        assert v.untyped_storage().data_ptr() == storage.data_ptr()
        assert storage.nbytes() == 8 * width * k.element_size()  # the whole [tokens, (Hq + 2 Hk) D] output
        assert k.data_ptr() - storage.data_ptr() == s.q_head_num * s.head_dim * k.element_size()
        assert v.data_ptr() - storage.data_ptr() == (s.q_head_num + s.head_num) * s.head_dim * k.element_size()
        assert k.stride() == v.stride() == (width, s.head_dim, 1)
        rows = 64
        plan_launch(torch.zeros(rows, s.head_num, s.head_dim, dtype=k.dtype),  # sgl-kernel's own checks pass
                    torch.zeros(rows, s.head_num, s.head_dim, dtype=k.dtype),
                    torch.arange(8), k, v, need_cuda=False)


def test_the_layer_rotary_is_llama31_rope_in_place():
    rotary = Rotary(128, CPU)
    assert rotary.kernel == TORCH_ROTARY and "interpreter" in (rotary.reason or "")
    qkv = torch.randn(5, (4 + 2 * 2) * 128).to(torch.bfloat16)
    q, k, v = split_qkv(qkv, 4, 2, 128)
    before = qkv.clone()
    positions = torch.tensor([0, 1, 4096, 8191, 100_000])
    rq, rk = rope_reference(q, k, rotary.cos_sin_cache, positions, True)
    rotary(q, k, positions)
    # float32 arithmetic as the reference, one rounding to bf16: the same bits
    assert torch.equal(q, rq.to(torch.bfloat16)) and torch.equal(k, rk.to(torch.bfloat16))
    assert torch.equal(v, split_qkv(before, 4, 2, 128)[2])  # v untouched
    inv = inv_freq(LLAMA31_ROPE, 128)  # llama3 scaling: low frequencies / 8, high ones kept
    base = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    assert inv[0] == base[0] and inv[-1] == pytest.approx(base[-1] / 8)


@pytest.mark.slow
def test_the_cos_sin_cache_is_sglangs_llama3_rope():
    rope = pytest.importorskip("sglang.srt.layers.rotary_embedding.rope_variant")
    # its constructor also picks a device kernel (vllm's on a CPU build); the cache is its own method
    theirs = rope.Llama3RotaryEmbedding.__new__(rope.Llama3RotaryEmbedding)
    torch.nn.Module.__init__(theirs)
    theirs.__dict__.update(rotary_dim=128, max_position_embeddings=1024, base=500000, position_start=0,
                           _force_native=False, scaling_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           orig_max_position=8192)
    assert torch.equal(cos_sin_cache(LLAMA31_ROPE, 128, 1024), theirs._compute_cos_sin_cache().float())


def test_rope_writers_in_the_layer_give_the_store_variants_output():
    """rope_triton_fused and rope_then_triton_fused (Triton's interpreter) replace the layer's
    rotary + store. Both rotate in float32 and round once as the torch rotary does, so the
    K cache and the layer's output are the same bits as index_put's after the rotary
    (tolerance 0: a 1-ulp difference in one rotated value would show here)."""
    config = _config()
    context = _context(config)
    out, k_cache = _layer_output(create_writer("index_put"), config, context)
    for writer in (RopeTritonFusedWriter(), RopeThenStoreWriter(store="triton_fused")):
        other, other_cache = _layer_output(writer, config, context)
        torch.testing.assert_close(other, out, rtol=0, atol=0, msg=writer.name)
        assert all(torch.equal(a, b) for a, b in zip(other_cache, k_cache)), writer.name


def test_rope_write_refuses_bad_input_in_one_line_before_writing():
    config = _config()
    with session_for(config, RopeTritonFusedWriter(), CPU, instrument=False, context=_context(config)) as session:
        q, k, v = split_qkv(torch.zeros(8, 6 * 128, dtype=torch.bfloat16), 2, 2, 128)
        cos_sin = session.rotary.cos_sin_cache  # type: ignore[union-attr]
        before = session.pool.k_buffer[0].clone()
        with pytest.raises(ValueError, match="positions has 3 tokens but loc has 8"):
            session._rope_write(0, torch.arange(8), q, k, v, torch.arange(3), cos_sin, True)
        assert torch.equal(session.pool.k_buffer[0], before)


def test_decode_attention_reads_the_cached_rows_and_the_new_token():
    """SGLang's kv_indptr/kv_indices layout: each request's ctx cached slots, then the slot
    its new token was written to this step (set by prepare_step)."""
    config = _config()
    context = _context(config)
    assert context.kernels.attention == TORCH_SDPA and "CPU" in (context.kernels.attention_reason or "")
    loc = torch.tensor([200, 201, 250, 203, 204, 205, 206, 299])
    context.prepare_step(loc, decode=True)
    meta = context.decode_meta(8)
    ctx = config.context_len
    assert meta.kv_indptr.tolist() == [i * (ctx + 1) for i in range(9)]
    rows = meta.kv_indices.view(8, ctx + 1)
    assert rows[3, :ctx].tolist() == list(range(1 + 3 * ctx, 1 + 4 * ctx)) and rows[:, ctx].tolist() == loc.tolist()
    assert context.positions(8, decode=True).tolist() == [ctx] * 8


@pytest.mark.slow
def test_sglangs_decode_kernel_in_the_interpreter_matches_sdpa():
    """The layout above through SGLang's own kernel (fp32: the interpreter's bf16 is wrong)."""
    pytest.importorskip("sglang")
    config = _config()
    shape = config.shape
    gen = torch.Generator().manual_seed(0)
    kb, vb = (torch.randn(400, shape.head_num, shape.head_dim, generator=gen) for _ in range(2))
    q = torch.randn(3, shape.q_head_num, shape.head_dim, generator=gen)
    outs = []
    for attention in ("sdpa", "sglang_triton"):
        context = DecoderContext(shape, torch.float32, CPU, 16, attention=attention)
        context.prepare_step(torch.tensor([300, 301, 350]), decode=True)
        outs.append(context._decode_attention(q, kb, vb, context.decode_meta(3)))
        assert context.kernels.attention == (TORCH_SDPA if attention == "sdpa" else SGLANG_DECODE)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


# -- the savings and the trace's account -------------------------------------------------------
def _samples(variant: str, mode: str, values: list[float], size: int = 10, clock: str = "cuda_events") -> StepSamples:
    return StepSamples(variant=variant, pass_="reference", phase="decode", size=size, mode=mode, graph=True,
                       writes_per_step=0 if mode == "layer_no_write" else 80, clock=clock, samples_ns=tuple(values))


def test_step_savings_are_medians_and_iqrs_of_the_reference_steps():
    steps = {"two_stream": [12.0e6, 12.1e6, 12.2e6, 12.3e6, 12.4e6],
             "rope_then_triton_fused": [11.9e6, 11.95e6, 12.0e6, 12.05e6, 12.1e6],
             "rope_triton_fused": [11.80e6, 11.82e6, 11.85e6, 11.9e6, 11.95e6]}
    alone = {"two_stream": [0.50e6] * 4, "rope_then_triton_fused": [0.30e6] * 4, "rope_triton_fused": [0.20e6] * 4}
    t = StepTimings(context="layer", records=[r for v in steps for r in (
        _samples(v, "layer", steps[v]), _samples(v, "writes", alone[v]), _samples(v, "layer_no_write", [11e6] * 4))])
    rows = {(s.variant, s.against): s for s in step_savings(t)}
    assert set(rows) == {("rope_triton_fused", "two_stream"), ("rope_triton_fused", "rope_then_triton_fused"),
                         ("rope_then_triton_fused", "two_stream")}  # the two references compared once
    s = rows[("rope_triton_fused", "rope_then_triton_fused")]

    def iqr(x: list[float]) -> float:
        q = statistics.quantiles(x, n=4, method="inclusive")
        return q[2] - q[0]

    assert s.saving_ns == pytest.approx(statistics.median(steps["rope_then_triton_fused"]) - 11.85e6)
    assert s.spread_ns == pytest.approx(math.hypot(iqr(steps["rope_triton_fused"]),
                                                   iqr(steps["rope_then_triton_fused"])))
    assert s.projected_ns == pytest.approx(0.10e6) and s.gap_ns == pytest.approx(s.saving_ns - 0.10e6)
    assert step_savings(StepTimings(context="none", records=t.records)) == []  # writes back to back: none


def test_step_savings_against_sglangs_generic_write():
    """An fp8 cache: SGLang's set_kv_buffer (four conversion kernels, then its store) is a reference,
    so a capture with it and a fused quantising writer reports that writer's saving against it."""
    steps = {"sglang_set_kv_buffer": [12.4e6] * 5, "triton_fused": [12.0e6] * 5}
    t = StepTimings(context="layer", records=[r for v in steps for r in (
        _samples(v, "layer", steps[v]), _samples(v, "layer_no_write", [11e6] * 4))])
    (s,) = step_savings(t)
    assert (s.variant, s.against) == ("triton_fused", "sglang_set_kv_buffer")
    assert s.saving_ns == pytest.approx(0.4e6) and s.projected_ns is None


def _layer_trace(variant: str, layer: list[KernelSpec], positions: list[int], tmp: Path) -> tuple:
    spec = TraceSpec(variant=variant, phases=[PhaseSpec("decode", 10, 2, graph=True)], write=WriteSpec(layer),
                     fused=True, with_sync=False)
    doc, _ = build(spec)
    doc["kvprof"]["context"] = "layer"
    doc["kvprof"]["template"] = {"decode 10": {"kernels": len(positions), "memcpy": 0, "memset": 0,
                                               "ops_per_layer": len(layer), "write_positions": positions}}
    path = tmp / f"{variant}.json"
    path.write_text(json.dumps(doc))
    trace = attribute(read_kineto(path))
    ev = to_frame(trace.events)
    return gpu_work_rows(ev), per_write_table(trace, ev)


def test_the_trace_shows_pdl_overlap_and_a_second_streams_wait():
    gemm, attn = KernelSpec(7, 0, 3000, "gemm"), KernelSpec(7, 6000, 4000, "attention")
    with tempfile.TemporaryDirectory() as tmp:
        # the fused rope write starts 300 ns before the GEMM ends (PDL), attention right after it
        fused = _layer_trace("rope_triton_fused", [gemm, KernelSpec(7, 2700, 900, "rope_kv_kernel"),
                                                   KernelSpec(7, 3700, 4000, "attention")], [1], Path(tmp))
        # two_stream: rotary, K on the main stream, V on stream 9 ending at 5500; attention waits for it
        two = _layer_trace("two_stream", [gemm, KernelSpec(7, 3200, 800, "rotary"), KernelSpec(7, 4200, 700, "k"),
                                          KernelSpec(9, 4300, 1200, "v"), attn], [2, 3], Path(tmp))
    (b_fused,) = write_boundaries(*fused)
    (b_two,) = write_boundaries(*two)
    assert (b_fused.writes, b_fused.early_starts, b_fused.same_stream_early) == (8, 8, 8)
    assert b_fused.early_overlap_ns == pytest.approx(300) and b_fused.second_stream == 0
    assert b_fused.critical_ns == pytest.approx(600)  # ends 600 ns after the GEMM
    assert b_two.early_starts == 0 and b_two.second_stream == 8
    assert b_two.stream_wait_ns == pytest.approx(6000 - 4900)  # attention's stream idle after K, waiting for V
    assert b_two.next_after_ns == pytest.approx(6000 - 5500)
    saving = step_savings(StepTimings(context="layer", records=[
        _samples("two_stream", "layer", [12e6] * 5), _samples("two_stream", "writes", [0.9e6] * 5),
        _samples("rope_triton_fused", "layer", [11.9e6] * 5), _samples("rope_triton_fused", "writes", [0.5e6] * 5)]))
    (note,) = gap_notes([s for s in saving if s.variant == "rope_triton_fused"], [b_fused, b_two],
                        ["reference", "kineto"])
    assert "0.100 ms" in note and "0.400 ms projected" in note and "gap -0.300 ms" in note
    assert "programmatic dependent launch" in note and "second stream" in note and "waits 1.10 µs" in note


def test_a_cpu_layer_capture_records_the_kernels_and_derives_the_savings(tmp_path, capsys):
    rc = main(["capture", "--model", "tiny=3x2x64", "--tp", "1", "--batch-sizes", "2", "--phase", "decode",
               "--steps", "2", "--warmup", "1", "--reference-steps", "6", "--no-progress", "--context", "layer",
               "--context-len", "8", "--variants", "index_put,two_stream", "--out", str(tmp_path), "--run-id", "l"])
    assert rc == 0
    out = " ".join(capsys.readouterr().out.split())
    run = tmp_path / "l"
    layer = orjson.loads((run / "manifest.json").read_bytes())["config"]["resolved"]["layer"]
    assert layer["attention"] == TORCH_SDPA and "CPU" in layer["attention_reason"]
    assert layer["rotary"] == TORCH_ROTARY and layer["rope"]["theta"] == 500000.0
    assert "decode attention: torch SDPA" in out and "step saving in the layer" in out
    timings = StepTimings.from_json((run / "step_timings.json").read_bytes())
    ref = {(r.variant, r.mode): r for r in timings.select(pass_="reference")}
    doc = LayerSteps.from_json(orjson.loads((run / "summary.json").read_bytes())["layer_steps"])
    assert doc is not None and doc.against == ["two_stream"]
    (s,) = doc.savings
    assert (s.variant, s.against, s.clock) == ("index_put", "two_stream", "wall")
    assert s.saving_ns == pytest.approx(ref[("two_stream", "layer")].median_ns - ref[("index_put", "layer")].median_ns)
    assert s.projected_ns == pytest.approx(ref[("two_stream", "writes")].median_ns
                                           - ref[("index_put", "writes")].median_ns)
    assert s.spread_ns == pytest.approx(math.hypot(ref[("two_stream", "layer")].iqr_ns,
                                                   ref[("index_put", "layer")].iqr_ns))
    # the one rule: a saving within the two steps' spread is noise, and never called measured
    noise = abs(s.saving_ns) <= s.spread_ns
    assert ("(noise" in out) == noise and ("measured step saving" in out) == (not noise)
    assert main(["analyze", str(run), "--no-files"]) == 0
    assert "in the layer: step saving against two_stream" in capsys.readouterr().out


# -- on a GPU ------------------------------------------------------------------------------------
def _gpu_config(**kw: object) -> CapturePlan:
    config = CaptureConfig(model="llama-3.1-70b", tp=8, variants=["triton_fused"], phases=["decode"],
                           decode_sizes=[10], steps=2, warmup=1, device="cuda", context="layer", context_len=256,
                           **kw)  # type: ignore[arg-type]
    # the session's layers: 2; the context below builds only these
    return dataclasses.replace(resolve(config, torch.device("cuda")), layers=2)


def _gpu_context(config: CapturePlan, attention: str = "auto") -> DecoderContext:
    from dataclasses import replace

    shape = replace(config.shape, layers=2)
    return DecoderContext(shape, torch.bfloat16, torch.device("cuda"), config.context_len, attention=attention)


@pytest.mark.gpu
def test_gpu_layer_rotary_is_the_triton_kernel_and_rope_writers_match_the_store():
    """On CUDA the layer rotates with kvprof's Triton rotary kernel (compiled, fp fusion off),
    the same arithmetic as the rope writers: their layer output is the store's, bit for bit."""
    config = _gpu_config()
    context = _gpu_context(config)
    assert context.kernels.rotary == "kvprof_triton_rotary"
    dev = torch.device("cuda")
    outs = []
    for writer in (create_writer("triton_fused"), RopeTritonFusedWriter(), RopeThenStoreWriter(store="triton_fused")):
        with session_for(config, writer, dev, instrument=False, context=context) as session:
            prepared = session.prepare(session.phases[0], 0)
            session.warm_up(prepared, "layer")
            session.capture_graph(prepared, "layer")  # PDL launches inside a captured layer
            session.run_step(prepared, 1, "layer")
            session.before_step(prepared, prepared.locs[1], "layer")
            outs.append(session.layer_step(prepared, prepared.locs[1], "layer").float().cpu())
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


@pytest.mark.gpu
def test_gpu_sglang_decode_attention_matches_sdpa_over_the_same_rows():
    pytest.importorskip("sglang.kernels.ops.attention.decode_attention")
    config = _gpu_config()
    shape = config.shape
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    kb, vb = (torch.randn(4000, shape.head_num, shape.head_dim, generator=gen, device=dev).to(torch.bfloat16)
              for _ in range(2))
    q = torch.randn(10, shape.q_head_num, shape.head_dim, generator=gen, device=dev).to(torch.bfloat16)
    loc = torch.arange(3000, 3010, device=dev)
    outs = []
    for attention in ("sglang_triton", "sdpa"):
        context = _gpu_context(config, attention)
        context.prepare_step(loc, decode=True)
        outs.append(context._decode_attention(q, kb, vb, context.decode_meta(10)).float())
    assert _gpu_context(config).kernels.attention == SGLANG_DECODE  # auto picks it where it imports
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)  # bf16 inputs, fp32 accumulation in both


def test_the_account_names_other_kernels_that_ran_longer_beside_a_write():
    """A write can slow the work around it: the MLP GEMM after it runs 2 µs longer in one
    variant's layer. The note says so, per layer, with the kernel; a rotary that is part of one
    variant's write (rope_then_*) is not counted among the other kernels."""
    attn = KernelSpec(7, 4000, 2000, "attention")
    with tempfile.TemporaryDirectory() as tmp:
        slow = _layer_trace("rope_then_triton_fused", [
            KernelSpec(7, 0, 3000, "gemm"), KernelSpec(7, 3000, 500, "rotary"), KernelSpec(7, 3500, 400, "store"),
            attn, KernelSpec(7, 6000, 5000, "mlp_gemm")], [1, 2], Path(tmp))
        fast = _layer_trace("sgl_kernel_cubin", [
            KernelSpec(7, 0, 3000, "gemm"), KernelSpec(7, 3000, 600, "rotary"), KernelSpec(7, 3600, 300, "store"),
            attn, KernelSpec(7, 6000, 3000, "mlp_gemm")], [2], Path(tmp))
    (b_slow,) = write_boundaries(*slow)
    (b_fast,) = write_boundaries(*fast)
    assert b_slow.write_kernels == ["rotary", "store"] and b_fast.write_kernels == ["store"]
    assert b_slow.other_kernels["mlp_gemm"] == pytest.approx(5000) and "rotary" not in b_slow.other_kernels
    assert b_fast.other_kernels["rotary"] == pytest.approx(600)
    assert WriteBoundary.from_json(orjson.loads(orjson.dumps(b_fast.to_json()))) == b_fast
    saving = step_savings(StepTimings(context="layer", records=[
        _samples("rope_then_triton_fused", "layer", [12e6] * 5),
        _samples("rope_then_triton_fused", "writes", [1e6] * 5),
        _samples("sgl_kernel_cubin", "layer", [11.8e6] * 5), _samples("sgl_kernel_cubin", "writes", [1e6] * 5)]),
        against=("rope_then_triton_fused",))
    (note,) = gap_notes(saving, [b_slow, b_fast], ["reference", "kineto"])
    assert ("the layer's other kernels ran 2.00 µs shorter per layer beside sgl_kernel_cubin's write than beside "
            "rope_then_triton_fused's (most: mlp_gemm -2.00 µs)") in note
