"""The plugins' sampled shadow check (``KVPROF_<ENGINE>_SHADOW=N``), without an engine: the core's
comparison (every N-th write, bitwise, padding and shared slots not held, a CUDA graph capture
skipped and counted), the vLLM adapter's hook over stand-in implementation classes (vLLM's own
write right, a wrong one, a planted wrong kvprof writer routed through the plugin, the CPU
backend skipped with its reason), and analyze's lines. The real SGLang pool: tests/test_sglang_plugin.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvprof.core.sidecar import decode_sidecar, shadow_lines
from kvprof.integrations import core, vllm as plugin_mod


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("KVPROF_VLLM_DIR", str(tmp_path))
    fresh = plugin_mod._State()
    monkeypatch.setattr(plugin_mod, "STATE", fresh)
    monkeypatch.setattr(plugin_mod, "_ranks", lambda: (0, 0, 1))
    return fresh


@pytest.mark.parametrize(("value", "every", "problem"), [("", 0, None), ("100", 100, None), ("0", 0, None),
                                                         ("x", 0, "not a whole number"), ("-3", 0, "negative")])
def test_shadow_variable(monkeypatch: pytest.MonkeyPatch, value: str, every: int, problem: str | None) -> None:
    monkeypatch.setenv("KVPROF_VLLM_SHADOW", value)
    got, why = core.shadow_every(plugin_mod.VLLM)
    assert got == every and (why is None if problem is None else problem in str(why))


def test_held_tokens_drop_padding_shared_and_out_of_range_slots() -> None:
    slots = [4, -1, 7, 4, 0, 9, 7, 2, 12]
    assert core.held_tokens(slots, 12, None) == [False, False, False, False, True, True, False, True, False]
    assert core.held_tokens(slots, 12, 0) == [False, False, False, False, False, True, False, True, False]


def test_to_store_matches_the_reference_and_sglangs_division() -> None:
    from kvprof.kvcache.dtypes import convert_for_cache

    x = torch.randn(5, 2, 8, generator=torch.Generator().manual_seed(1)).bfloat16() * 4
    for scale in (None, 0.37, torch.tensor([0.37])):
        assert torch.equal(core.to_store(x, torch.float8_e4m3fn, scale, divide=False),
                           convert_for_cache(x, torch.float8_e4m3fn, scale))
    # SGLang's own path: cache_k.div_(k_scale) in the input's dtype, then the cast
    want = (x.clone().div_(0.37)).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(core.to_store(x, torch.float8_e4m3fn, 0.37, divide=True), want)


def test_every_nth_write_is_compared_and_a_wrong_row_named() -> None:
    shadow = core.Shadow(3)
    due = [shadow.due() for _ in range(9)]
    assert due == [False, False, True] * 3 and shadow.sampled == 3
    slots = torch.tensor([5, 2, 8])
    k = torch.randn(3, 4)
    got = k.clone()
    shadow.compare(1, "w", slots, got, got, k, k, rows=16)
    got[2, 3] += 1  # one element of slot 8's row
    shadow.compare(2, "w", slots, got, k, k, k, rows=16)
    shadow.compare(3, "w", slots, got, k, k, k, rows=8)  # slot 8 past the cache: not held
    shadow.compare(3, "w", slots, got, k, k, k, rows=16, pad=8)  # slot 8 the dummy slot: not held
    shadow.compare(3, "w", torch.tensor([5, 8, 8]), got, k, k, k, rows=16)  # slot 8 written twice: not held
    rec = shadow.record()
    assert (rec.checked, rec.mismatched, rec.rows_checked, rec.rows_mismatched) == (5, 1, 11, 1)
    assert [(m.layer, m.slot, m.rows) for m in rec.first_mismatches] == [(2, 8, 1)]
    shadow.compare(4, "w", torch.tensor([-1, 0, 0]), got, k, k, k, rows=16, pad=0)
    shadow.compare(4, "w", slots[:0], got[:0], k[:0], k[:0], k[:0], rows=16)
    rec = shadow.record()
    assert rec.checked == 5 and sum(rec.skipped.values()) == 2


def test_pending_counts_are_read_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "SHADOW_PENDING", 4)
    shadow = core.Shadow(1)
    k = torch.zeros(2, 3)
    for _ in range(3):
        shadow.compare(0, "w", torch.tensor([1, 2]), k, k, k, k, rows=4)
    assert len(shadow.pending) == 3 and shadow.checked == 0
    shadow.compare(0, "w", torch.tensor([1, 2]), k, k, k, k, rows=4)
    assert not shadow.pending and shadow.checked == 4


def test_a_write_inside_a_graph_capture_is_skipped_and_counted(state: Any) -> None:
    state.shadow = core.Shadow(1)
    core.GRAPHS.begin(object())
    try:
        assert not state.shadow_due(torch.device("cpu"))
    finally:
        core.GRAPHS.end()
    assert state.shadow.skipped == {core.SKIP_CAPTURE: 1}
    assert state.shadow_due(torch.device("cpu"))


def _packed(blocks: int, heads: int, block_size: int, dim: int, gen: torch.Generator) -> tuple[Any, Any, Any]:
    """vLLM's packed cache [blocks, heads, block_size, 2*dim] and its K/V [blocks, block_size, heads, dim] views."""
    cache = torch.randn(blocks, heads, block_size, 2 * dim, generator=gen).bfloat16()
    k, v = cache.transpose(1, 2).split(dim, dim=-1)
    return cache, k, v


@pytest.mark.parametrize("pad", [None, 0])
def test_graph_kernel_counts_each_replay_and_names_the_first_wrong_slot(pad: int | None) -> None:
    """The kernel a capture records after a write (run here by Triton's interpreter): each run adds
    one replay, the rows it held (padding -1, the dummy slot ``pad``, slots past the cache left out)
    and the wrong ones; the first wrong slot is kept."""
    from kvprof.integrations import shadow_kernel as sk

    gen = torch.Generator().manual_seed(3)
    _, kc, vc = _packed(4, 2, 4, 8, gen)
    slots = torch.tensor([3, -1, 9, 14, 0, 16])
    key, value = (torch.randn(6, 2, 8, generator=gen).bfloat16() for _ in range(2))
    for t, s in enumerate(slots.tolist()):
        if 0 <= s < 16:
            kc[s // 4, s % 4], vc[s // 4, s % 4] = key[t], value[t]
    counts = torch.tensor([0, 0, 0, 0, -1])
    held = 4 if pad is None else 3
    for _ in range(3):
        sk.compare_rows(slots, key, value, kc, vc, 16, pad, counts)
    assert counts.tolist() == [3, 3 * held, 0, 0, -1]
    vc[2, 1, 1, 5] += 1  # slot 9's V
    kc[3, 2, 0, 0] += 1  # slot 14's K
    sk.compare_rows(slots, key, value, kc, vc, 16, pad, counts)
    assert counts.tolist() == [4, 4 * held, 2, 1, 9]
    sk.compare_rows(slots[3:4], key[3:4], value[3:4], kc, vc, 16, pad, counts)
    assert counts.tolist() == [5, 4 * held + 1, 3, 2, 9]


def test_graph_kernel_reads_a_pool_of_rows_as_blocks_of_one() -> None:
    """SGLang's pool ([rows, heads, dim]) as blocks of one row, its dummy slot 0 not held."""
    from kvprof.integrations import shadow_kernel as sk

    gen = torch.Generator().manual_seed(4)
    k_buf, v_buf = (torch.randn(10, 3, 16, generator=gen).half() for _ in range(2))
    slots = torch.tensor([0, 7, 2])
    key, value = k_buf[slots].clone(), v_buf[slots].clone()
    key[0] += 1  # the dummy slot's token: not held
    counts = torch.tensor([0, 0, 0, 0, -1])
    assert sk.refusal(slots, key, value, k_buf.unsqueeze(1), v_buf.unsqueeze(1)) is None
    sk.compare_rows(slots, key, value, k_buf.unsqueeze(1), v_buf.unsqueeze(1), 10, 0, counts)
    assert counts.tolist() == [1, 2, 0, 0, -1]
    assert "fp8" in sk.refusal(slots, key, value, k_buf.unsqueeze(1).to(torch.uint8), v_buf.unsqueeze(1))


def test_graph_checks_add_to_the_sidecar_counts() -> None:
    """Writes checked inside a graph count in ``checked`` and the rows with their replays; the sidecar
    says how many captured writes have a check and how many replays ran it."""
    from kvprof.integrations import shadow_kernel as sk

    shadow = core.Shadow(1)
    block = torch.zeros(core.SHADOW_GRAPH_ROWS, sk.COUNTS, dtype=torch.int64)
    block[:, sk.FIRST] = -1
    shadow.blocks.stack = [[block, 0]]  # what before_capture allocates on CUDA
    assert shadow.graph_row_free()
    gen = torch.Generator().manual_seed(5)
    _, kc, vc = _packed(2, 1, 4, 8, gen)
    slots = torch.tensor([1, 6])
    key, value = kc[[0, 1], [1, 2]].clone(), vc[[0, 1], [1, 2]].clone()
    shadow.compare_in_graph(3, "w", slots, key, value, kc, vc, 8)
    shadow.compare_in_graph(4, "w", slots, key, value.float(), kc, vc, 8)  # converted: not compared
    sk.compare_rows(slots, key, value, kc, vc, 8, None, block[0])  # a second replay
    vc[1, 2] += 1
    sk.compare_rows(slots, key, value, kc, vc, 8, None, block[0])  # a third, slot 6 wrong
    rec = shadow.record()
    assert (rec.in_graphs, rec.replayed, rec.checked, rec.rows_checked) == (1, 3, 3, 6)
    assert (rec.mismatched, rec.rows_mismatched) == (1, 1)
    assert [(m.layer, m.slot) for m in rec.first_mismatches] == [(3, 6)]
    assert list(rec.skipped) == ["w in a CUDA graph: inputs converted on the way into the cache (fp8): "
                                 "not compared inside a CUDA graph"]


class TritonAttentionImpl:
    """vLLM's CUDA backends' implementation, as the route and the shadow check read it; its write is
    vLLM's op in torch (``reshape_and_cache_flash`` into the packed cache), or off by one slot."""

    off = 0

    def __init__(self, head_size: int) -> None:
        self.head_size, self.kv_cache_dtype, self.attn_type = head_size, "auto", "decoder"

    def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
        k, v = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        bs = k.shape[1]
        for t, s in enumerate(slot_mapping.tolist()):
            if s >= 0:
                s = (s + self.off) % (k.shape[0] * bs)
                k[s // bs, s % bs] = key[t]
                v[s // bs, s % bs] = value[t]


class OffByOneImpl(TritonAttentionImpl):
    off = 1

    def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)


OffByOneImpl.__name__ = "TritonAttentionImpl"  # a backend whose cache views kvprof knows


class CPUAttentionBackendImpl(TritonAttentionImpl):
    isa = "vec"

    def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)


class Layer:
    def __init__(self, i: int) -> None:
        self.layer_name = f"model.layers.{i}.self_attn.attn"


def _run(state: Any, impl_cls: type, writes: int, every: int, writer: str | None = None,
         dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """``writes`` MHA writes through the hooked stand-in (2 layers, padding and a shared slot among
    the tokens), the shadow check on every ``every``-th; the sidecar as written."""
    state.writer_name = writer
    state.shadow = core.Shadow(every)
    hook = plugin_mod._make_hook(impl_cls, "do_kv_cache_update", impl_cls.__dict__["do_kv_cache_update"])
    impl = impl_cls(16)
    gen = torch.Generator().manual_seed(7)
    caches = [torch.randn(6, 2, 4, 32, generator=gen).to(dtype) for _ in range(2)]
    for i in range(writes):
        slots = torch.randperm(24, generator=gen)[:5]
        slots[1] = -1
        slots[3] = slots[4]
        key, value = (torch.randn(5, 2, 16, generator=gen).to(dtype) for _ in range(2))
        hook(impl, Layer(i % 2), key, value, caches[i % 2], slots)
    path = state.write_sidecar()
    assert path is not None
    return json.loads(path.read_text())


def test_vllms_own_write_checked_right(state: Any) -> None:
    doc = _run(state, TritonAttentionImpl, writes=10, every=2)["shadow"]
    assert (doc["every"], doc["writes"], doc["sampled"], doc["checked"], doc["mismatched"]) == (2, 10, 5, 5, 0)
    assert doc["rows_checked"] == 5 * 2  # of 5 tokens: padding and the two sharing a slot not held
    assert doc["skipped"] == {} and doc["first_mismatches"] == []


def test_a_wrong_write_is_caught_and_named(state: Any) -> None:
    doc = _run(state, OffByOneImpl, writes=4, every=1)["shadow"]
    assert doc["checked"] == 4 and doc["mismatched"] == 4 and doc["rows_mismatched"] == 8
    assert [(m["variant"], m["layer"]) for m in doc["first_mismatches"]] == [("vllm_mha", i % 2) for i in range(4)]


def test_a_planted_wrong_writer_routed_through_the_plugin_is_caught(state: Any) -> None:
    """verify's plant ``paged_contiguous_loc`` (the slots read as a run from the first) as
    KVPROF_VLLM_WRITER: the route writes with it, the shadow check names the rows."""
    side = _run(state, TritonAttentionImpl, writes=6, every=1, writer="planted_writers:paged_contiguous_loc")
    assert side["paths"] == {"writer:paged_contiguous_loc:planted": 6}
    doc = side["shadow"]
    assert doc["checked"] == 6 and doc["mismatched"] == 6
    assert {m["variant"] for m in doc["first_mismatches"]} == {"paged_contiguous_loc"}


def test_a_right_writer_routed_through_the_plugin_passes(state: Any) -> None:
    side = _run(state, TritonAttentionImpl, writes=6, every=1, writer="paged_index_put", dtype=torch.float16)
    assert list(side["paths"]) == ["writer:paged_index_put:two_index_puts"] and \
        side["paths"]["writer:paged_index_put:two_index_puts"] == 6
    assert side["shadow"]["checked"] == 6 and side["shadow"]["mismatched"] == 0


@pytest.mark.parametrize(("kv_dtype", "torch_dtype"), [("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_vllm_fp8_cache_checked_through_vllms_conversion(state: Any, kv_dtype: str, torch_dtype: Any) -> None:
    """An fp8 cache (uint8 bytes, the layer's _k_scale/_v_scale): a write converting as vLLM's op
    does passes; one that skips the scale is caught."""
    from kvprof.kvcache.dtypes import convert_like_vllm

    class TritonAttentionImpl:
        scaled = True

        def __init__(self) -> None:
            self.head_size, self.kv_cache_dtype, self.attn_type = 16, kv_dtype, "decoder"

        def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
            k, v = kv_cache.transpose(1, 2).split(16, dim=-1)
            s = slot_mapping
            k_scale, v_scale = (layer._k_scale, layer._v_scale) if self.scaled else (None, None)
            k[s // 4, s % 4] = convert_like_vllm(key, torch_dtype, k_scale)
            v[s // 4, s % 4] = convert_like_vllm(value, torch_dtype, v_scale)

    layer = Layer(3)
    layer._k_scale, layer._v_scale = torch.tensor([0.37]), torch.tensor([1.7])  # type: ignore[attr-defined]
    hook = plugin_mod._make_hook(TritonAttentionImpl, "do_kv_cache_update",
                                 TritonAttentionImpl.__dict__["do_kv_cache_update"])
    state.shadow = core.Shadow(1)
    impl = TritonAttentionImpl()
    cache = torch.zeros(6, 2, 4, 32, dtype=torch.uint8)
    gen = torch.Generator().manual_seed(3)
    key, value = (torch.randn(5, 2, 16, generator=gen).bfloat16() * 3 for _ in range(2))
    hook(impl, layer, key, value, cache, torch.randperm(24, generator=gen)[:5])
    impl.scaled = False
    hook(impl, layer, key, value, cache, torch.randperm(24, generator=gen)[:5])
    rec = state.shadow.record()
    assert (rec.checked, rec.mismatched, rec.skipped) == (2, 1, {})
    assert [(m.layer, m.variant) for m in rec.first_mismatches] == [(3, "vllm_mha")]


def test_cpu_backend_is_skipped_with_its_reason(state: Any) -> None:
    doc = _run(state, CPUAttentionBackendImpl, writes=3, every=1)["shadow"]
    assert doc["checked"] == 0 and doc["sampled"] == 3
    (reason,) = doc["skipped"]
    assert "packs each block for its ISA" in reason and doc["skipped"][reason] == 3


def test_analyze_says_a_mismatch_loudly(state: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(state, OffByOneImpl, writes=2, every=1)
    (path,) = tmp_path.glob("kvprof-vllm.TP-0.pid-*.json")
    wrong, lines = shadow_lines(decode_sidecar(path.read_bytes(), path.name))
    assert wrong and "KV ROWS DIFFER FROM THE WRITE'S INPUTS in 2 writes" in lines[0]
    assert "vllm_mha L0 slot" in lines[0]
    from kvprof.report.console import make_console
    from kvprof.report.write_kernels import render_shadow

    render_shadow([json.loads(path.read_text())], make_console())
    assert "KV ROWS DIFFER" in " ".join(capsys.readouterr().out.split())
    from kvprof.report.write_kernels import shadow_cell

    assert shadow_cell(json.loads(path.read_text())["shadow"]) == "1 in 1: 2 checked, 2 WRONG, 0 skipped"
    assert shadow_cell(None) == "off"


def test_off_by_default(state: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPROF_VLLM_SHADOW", raising=False)
    state.shadow_on()
    assert state.shadow.every == 0 and state.sidecar().shadow is None


class VectorImpl:
    """vLLM's write as two index writes on the device (no host read), or off by one slot."""

    off = 0

    def __init__(self, head_size: int) -> None:
        self.head_size, self.kv_cache_dtype, self.attn_type = head_size, "auto", "decoder"

    def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
        k, v = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        bs = k.shape[1]
        s = (slot_mapping + self.off) % (k.shape[0] * bs)
        k[s // bs, s % bs] = key
        v[s // bs, s % bs] = value


VectorImpl.__name__ = "TritonAttentionImpl"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("off", [0, 1])
def test_gpu_check_reads_nothing_on_the_host_and_skips_a_capture(state: Any, off: int) -> None:
    """On a GPU: the comparison of a sampled write runs on the device with no host sync (torch's
    sync debug mode set to error around the writes); its counts are read when the sidecar is
    written; a write inside a CUDA graph capture is skipped and counted, and the capture works."""
    impl_cls = type("TritonAttentionImpl", (VectorImpl,), {"off": off})
    hook = plugin_mod._make_hook(impl_cls, "do_kv_cache_update", VectorImpl.__dict__["do_kv_cache_update"])
    dev = torch.device("cuda", torch.cuda.current_device())
    impl = impl_cls(64)
    cache = torch.zeros(32, 4, 16, 128, dtype=torch.bfloat16, device=dev)
    key = torch.randn(8, 4, 64, device=dev).bfloat16()
    value = torch.randn(8, 4, 64, device=dev).bfloat16()
    slots = torch.randperm(512, device=dev)[:8]
    state.shadow = core.Shadow(1)
    hook(impl, Layer(0), key, value, cache, slots)  # the first write describes the cache (host reads)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            hook(impl, Layer(1), key, value, cache, slots)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        hook(impl, Layer(0), key, value, cache, slots)
        seen_capturing = core.Shadow(1).capturing("cuda")  # SGLang's pool.device is a string
    graph.replay()
    torch.cuda.synchronize()
    assert seen_capturing
    rec = state.sidecar().shadow
    assert rec is not None and rec.skipped == {core.SKIP_CAPTURE: 1}
    assert rec.checked == 21 and rec.rows_checked == 21 * 8
    assert rec.mismatched == (21 if off else 0)


def test_sglangs_canary_violations_read_into_the_sidecar(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's own KV canary reporter (its real ViolationReporter in log mode, over a violation ring
    of two rows as its verify kernel leaves them): each violation it logs is counted in the SGLang
    plugin's sidecar, by fail reason, its line kept; analyze says it in red and among its warnings."""
    reporter_mod = pytest.importorskip("sglang.srt.kv_canary.runner.violation_reporter")
    from types import SimpleNamespace

    from sglang.kernels.ops.kv_canary.consts import FailReason
    from sglang.srt.kv_canary.config import CanaryMode

    from kvprof.integrations import sglang as sg

    monkeypatch.setenv("KVPROF_SGLANG_DIR", str(tmp_path))
    fresh = sg._State()
    monkeypatch.setattr(sg, "STATE", fresh)
    monkeypatch.setattr(sg, "_ranks", lambda: (0, 0, 1))
    monkeypatch.setattr(reporter_mod, sg.CANARY_FUNCTION, getattr(reporter_mod, sg.CANARY_FUNCTION))  # restored after
    assert sg.hook_canary(reporter_mod) and sg.hook_canary(reporter_mod)  # once
    fresh.pools[1] = {"class": "MHATokenToKVPool"}  # a process that wrote: it leaves a sidecar
    ring = torch.zeros(1024, 8, dtype=torch.int64)
    ring[0] = torch.tensor([2, 17, 5, 11, 12, 0, 0, int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)])
    ring[1] = torch.tensor([0, 40, 9, 3, 3, 0, 0, int(FailReason.WRITE_TOKEN_MISMATCH)])
    state = SimpleNamespace(violation_log=SimpleNamespace(violation_write_index=torch.tensor([2]),
                                                          violation_ring=ring))
    reporter = reporter_mod.ViolationReporter(config=SimpleNamespace(mode=CanaryMode.LOG), device_state=state)
    reporter.log_or_raise_violation(outer_step_counter=7)
    side = fresh.write_sidecar()
    assert side is not None
    canary = json.loads(side.read_text())["canary"]
    assert canary["violations"] == 2 and canary["total"] == 2
    assert canary["by_reason"] == {"verify_chain_hash": 1, "write_token": 1}
    assert "slot_idx=17" in canary["first"][0] and "slot_idx=40" in canary["first"][1]
    from kvprof.core.sidecar import canary_lines

    lines = canary_lines(decode_sidecar(side.read_bytes(), side.name))
    assert "2 VIOLATIONS reported" in lines[0]
    from kvprof.report.console import make_console
    from kvprof.report.write_kernels import render_shadow

    render_shadow([json.loads(side.read_text())], make_console())
    assert "2 VIOLATIONS" in " ".join(capsys.readouterr().out.split())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("off", [0, 1])
def test_gpu_writes_captured_into_a_graph_are_checked_at_every_replay(state: Any, off: int) -> None:
    """On a GPU, through kvprof's CUDA-graph hook: every N-th write captured into a graph gets a
    comparison kernel, which runs at each replay; a writer one slot off is caught in each replay."""
    graph_cls = type("HookedCUDAGraph", (torch.cuda.CUDAGraph,), {})  # torch's own class left alone
    assert "not hooked" not in core.hook_graphs(graph_cls, lambda: core.GRAPHS, lambda: None)
    impl_cls = type("TritonAttentionImpl", (VectorImpl,), {"off": off})
    hook = plugin_mod._make_hook(impl_cls, "do_kv_cache_update", VectorImpl.__dict__["do_kv_cache_update"])
    dev = torch.device("cuda", torch.cuda.current_device())
    impl = impl_cls(128)
    caches = [torch.zeros(32, 1, 16, 256, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    key = torch.randn(8, 1, 128, device=dev).bfloat16()
    value = torch.randn(8, 1, 128, device=dev).bfloat16()
    slots = torch.randperm(512, device=dev)[:8]
    state.shadow = core.Shadow(0)
    for layer in range(4):  # eager first writes describe each layer's cache
        hook(impl, Layer(layer), key, value, caches[layer], slots)
    state.shadow = core.Shadow(2)
    graph = graph_cls()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        for layer in range(4):
            hook(impl, Layer(layer), key, value, caches[layer], slots)
    torch.cuda.synchronize()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    rec = state.sidecar().shadow
    assert rec is not None and rec.skipped == {}
    assert (rec.in_graphs, rec.replayed, rec.checked, rec.rows_checked) == (2, 10, 10, 80)
    assert rec.mismatched == (10 if off else 0) and rec.rows_mismatched == (80 if off else 0)
