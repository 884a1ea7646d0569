"""The pool's SGLang contract: layout, dtype views, scaling, and validation before any write."""

from __future__ import annotations

import pytest
import torch

from kvprof.kvcache.dtypes import convert_for_cache
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import create_writer


def make(dtype=torch.bfloat16, heads=2, dim=8, vdim=None, layers=3, size=64, page=1, start=0):
    return KVPool(size, page, dtype, heads, dim, layers, "cpu", writer=create_writer("index_put"),
                  v_head_dim=vdim, start_layer=start)


def rows(n, heads=2, dim=8, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, heads, dim), generator=g).to(dtype)


def test_layout_matches_sglang():
    pool = make(heads=2, dim=8, vdim=4, size=64, page=16)
    assert pool.k_buffer[0].shape == (64 + 16, 2, 8)
    assert pool.v_buffer[0].shape == (64 + 16, 2, 4)
    assert len(pool.k_buffer) == 3


def test_fp8_stored_as_uint8_and_read_back_as_fp8():
    pool = make(dtype=torch.float8_e4m3fn)
    assert pool.store_dtype == torch.uint8
    assert pool.k_buffer[0].dtype == torch.uint8
    assert pool.get_key_buffer(0).dtype == torch.float8_e4m3fn
    assert pool.get_value_buffer(0).dtype == torch.float8_e4m3fn


def test_write_lands_at_slots_and_nowhere_else():
    pool = make()
    loc = torch.tensor([3, 7, 0])
    k, v = rows(3), rows(3, seed=1)
    pool.set_kv_buffer(1, loc, k, v)
    kb, vb = pool.get_kv_buffer(1)
    assert torch.equal(kb[loc], k) and torch.equal(vb[loc], v)
    untouched = torch.ones(kb.shape[0], dtype=torch.bool)
    untouched[loc] = False
    assert not kb[untouched].any() and not vb[untouched].any()
    assert not pool.get_key_buffer(0).any() and not pool.get_key_buffer(2).any()


def test_scaled_fp8_write_matches_reference_and_does_not_mutate_inputs():
    pool = make(dtype=torch.float8_e5m2)
    k, v = rows(5), rows(5, seed=2)
    k0, v0 = k.clone(), v.clone()
    loc = torch.arange(1, 6)
    pool.set_kv_buffer(0, loc, k, v, k_scale=0.5, v_scale=3.0)
    assert torch.equal(k, k0) and torch.equal(v, v0)  # SGLang's div_ mutates; kvprof must not
    expected = convert_for_cache(k, torch.float8_e5m2, 0.5)
    assert torch.equal(pool.k_buffer[0][loc], expected)
    ref = (k.float() * (1 / 0.5)).to(torch.bfloat16).to(torch.float8_e5m2).view(torch.uint8)
    assert torch.equal(expected, ref)


def test_start_layer_and_override():
    pool = make(layers=2, start=10)
    k = rows(1)
    pool.set_kv_buffer(11, torch.tensor([4]), k, k)
    assert torch.equal(pool.get_key_buffer(11)[4], k[0])

    class Layer:
        layer_id = 999

    pool.set_kv_buffer(Layer(), torch.tensor([5]), k, k, layer_id_override=10)
    assert torch.equal(pool.get_key_buffer(10)[5], k[0])
    with pytest.raises(ValueError, match="layer 0 is not in this pool"):
        pool.set_kv_buffer(0, torch.tensor([1]), k, k)


def test_flat_rows_accepted():
    pool = make()
    k = rows(2)
    pool.set_kv_buffer(0, torch.tensor([1, 2]), k.reshape(2, 16), k.reshape(2, 16))
    assert torch.equal(pool.get_key_buffer(0)[1:3], k)


def test_zero_tokens_is_a_no_op():
    pool = make()
    pool.set_kv_buffer(0, torch.empty(0, dtype=torch.int64), rows(0), rows(0))
    assert not pool.get_key_buffer(0).any()


@pytest.mark.parametrize(
    ("loc", "k", "v", "match"),
    [
        (torch.tensor([1, -1]), rows(2), rows(2), "negative slot"),
        (torch.tensor([1, 65]), rows(2), rows(2), "past the last slot 64"),
        (torch.tensor([1.0, 2.0]), rows(2), rows(2), "int32 or int64"),
        (torch.tensor([[1, 2]]), rows(2), rows(2), "1-D"),
        ([1, 2], rows(2), rows(2), "must be a tensor"),
        (torch.tensor([1, 2, 3]), rows(2), rows(3), "cache_k has 2 tokens but loc has 3"),
        (torch.tensor([1, 2]), rows(2), rows(3), "cache_v has 3 tokens but loc has 2"),
        (torch.tensor([1, 2]), rows(2, heads=3), rows(2), r"cache_k rows have shape \(3, 8\)"),
        (torch.tensor([1, 2]), rows(2), rows(2, dim=4), r"cache_v rows have shape \(2, 4\)"),
        (torch.tensor([1, 2]), rows(2), rows(2, dtype=torch.float16), "cache_k is torch.bfloat16 but cache_v"),
        (torch.tensor([1, 2]), rows(2).to(torch.int32), rows(2).to(torch.int32), "floating point"),
    ],
)
def test_bad_input_raises_before_any_write(loc, k, v, match):
    pool = make()
    with pytest.raises(ValueError, match=match):
        pool.set_kv_buffer(0, loc, k, v)
    assert not pool.get_key_buffer(0).any() and not pool.get_value_buffer(0).any()


def test_device_mismatch_is_named():
    pool = make()
    k = rows(1)
    with pytest.raises(ValueError, match="is on meta, the pool is on cpu"):
        pool.set_kv_buffer(0, torch.tensor([1], device="meta"), k, k)


def test_bad_scale():
    pool = make(dtype=torch.float8_e4m3fn)
    k = rows(1)
    with pytest.raises(ValueError, match="finite and non-zero"):
        pool.set_kv_buffer(0, torch.tensor([1]), k, k, k_scale=0.0)


@pytest.mark.parametrize("kwargs", [{"size": 0}, {"heads": -1}, {"vdim": 0}, {"start": -2}])
def test_bad_construction(kwargs):
    with pytest.raises(ValueError):
        make(**kwargs)


def test_bytes_per_write_counts_read_and_write():
    pool = make(dtype=torch.float8_e4m3fn, heads=1, dim=128)
    # bf16 inputs read (2 x 128 x 2 B) + fp8 rows written (2 x 128 x 1 B), per token
    assert pool.bytes_per_write(10, torch.bfloat16) == 10 * (512 + 256)


# --- writers that check their own inputs (KVWriter.validates_inputs) -----------------------
class _CheckingWriter:
    """A stand-in for cuda_fused: refuses bad calls itself, before writing anything."""

    name = "checking"
    validates_inputs = True

    def __init__(self, fail_with: Exception | None = None):
        self.calls = 0
        self.fail_with = fail_with

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):
        from kvprof.kvcache.validation import check_buffers_inputs

        self.calls += 1
        try:
            check_buffers_inputs(k_buf, v_buf, loc, cache_k, cache_v)
        except ValueError:
            raise RuntimeError("checking: refused") from None  # a compiled op's own words
        if self.fail_with:
            raise self.fail_with
        k_buf[loc] = cache_k.reshape(k_buf[loc].shape)
        v_buf[loc] = cache_v.reshape(v_buf[loc].shape)
        return "fused"


def _checking_pool(writer, check_slots=False):
    return KVPool(64, 1, torch.bfloat16, 2, 8, 3, "cpu", writer=writer, check_slots=check_slots)


def test_a_checking_writer_takes_valid_calls_without_the_pools_python_checks(monkeypatch):
    import kvprof.kvcache.pool as pool_mod

    checked = []
    real = pool_mod.check_write_inputs
    monkeypatch.setattr(pool_mod, "check_write_inputs", lambda *a: checked.append(1) or real(*a))
    pool = _checking_pool(_CheckingWriter())
    k = rows(3)
    pool.set_kv_buffer(0, torch.tensor([1, 2, 3]), k, k)
    assert checked == [] and torch.equal(pool.get_key_buffer(0)[1:4], k)
    assert pool.path_counts == {"fused": 1}
    # slot checks are the pool's (a device sync): with them on, every check runs in Python
    slow = _checking_pool(_CheckingWriter(), check_slots=True)
    slow.set_kv_buffer(0, torch.tensor([1, 2, 3]), k, k)
    assert checked == [1]


@pytest.mark.parametrize(
    ("loc", "k", "v", "match"),
    [
        (torch.tensor([1.0, 2.0]), rows(2), rows(2), "int32 or int64"),
        ([1, 2], rows(2), rows(2), "must be a tensor"),
        (torch.tensor([1, 2, 3]), rows(2), rows(3), "cache_k has 2 tokens but loc has 3"),
        (torch.tensor([1, 2]), rows(2, heads=3), rows(2), r"cache_k rows have shape \(3, 8\)"),
        (torch.tensor([1, 2]), rows(2), rows(2, dtype=torch.float16), "cache_k is torch.bfloat16 but cache_v"),
    ],
)
def test_a_refusal_by_a_checking_writer_gets_the_pools_words(loc, k, v, match):
    pool = _checking_pool(_CheckingWriter())
    with pytest.raises(ValueError, match=match):
        pool.set_kv_buffer(0, loc, k, v)
    assert not pool.get_key_buffer(0).any()


def test_a_checking_writers_own_error_on_valid_input_is_kept():
    pool = _checking_pool(_CheckingWriter(fail_with=RuntimeError("launch failed: out of resources")))
    with pytest.raises(RuntimeError, match="launch failed"):
        pool.set_kv_buffer(0, torch.tensor([1]), rows(1), rows(1))
    assert not pool.path_counts


def test_store_kv_fused_checks_its_triton_path_itself():
    """On CPU store_kv_fused runs the Triton kernel (interpreter), which checks nothing: the
    writer checks first, so the pool may skip its own checks and still refuse bad input."""
    w = create_writer("store_kv_fused")
    if w.unsupported_reason(torch.device("cpu"), torch.bfloat16):
        pytest.skip("triton is not importable")
    assert w.validates_inputs
    pool = _checking_pool(w)
    with pytest.raises(ValueError, match="cache_v has 3 tokens but loc has 2"):
        pool.set_kv_buffer(0, torch.tensor([1, 2]), rows(2), rows(3))
    with pytest.raises(ValueError, match="cache_k has 2 tokens but loc has 1"):
        w.write(pool.k_buffer[0], pool.v_buffer[0], torch.tensor([1]), rows(2), rows(2), torch.bfloat16)
    k = rows(2)
    pool.set_kv_buffer(0, torch.tensor([4, 5]), k, k)
    assert torch.equal(pool.get_key_buffer(0)[4:6], k)


_GPU_BAD = [
    (lambda: torch.tensor([1.0, 2.0]), 2, 2, {}, "int32 or int64"),
    (lambda: torch.tensor([[1, 2]]), 2, 2, {}, "1-D"),
    (lambda: [1, 2], 2, 2, {}, "must be a tensor"),
    (lambda: torch.tensor([1, 2, 3]), 2, 3, {}, "cache_k has 2 tokens but loc has 3"),
    (lambda: torch.tensor([1, 2]), 2, 3, {}, "cache_v has 3 tokens but loc has 2"),
    (lambda: torch.tensor([1, 2]), 2, 2, {"heads": 4, "dim": 4}, r"cache_k rows have shape \(4, 4\)"),
    (lambda: torch.tensor([1, 2]), 2, 2, {"v_dtype": torch.float16}, "cache_k is torch.bfloat16 but cache_v"),
    (lambda: torch.tensor([1, 2]), 2, 2, {"dtype": torch.int32}, "floating point"),
    (lambda: torch.tensor([1, 2]), 2, 2, {"cpu_rows": True}, "is on cpu, the pool is on cuda"),
    (lambda: torch.empty(0, dtype=torch.int64), 3, 3, {}, "cache_k has 3 tokens but loc has 0"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["cuda_fused", "store_kv_fused"])
@pytest.mark.parametrize(("make_loc", "nk", "nv", "opts", "match"), _GPU_BAD)
def test_compiled_checks_refuse_what_the_pool_refuses(variant, make_loc, nk, nv, opts, match):
    """The fast path on a GPU: cuda_fused's C++ checks refuse every call the pool's Python
    checks refuse, before launching, and the pool words the error the same way."""
    w = create_writer(variant)
    pool = KVPool(64, 1, torch.bfloat16, 2, 8, 1, "cuda", writer=w, check_slots=False)
    good = rows(1).cuda()
    pool.set_kv_buffer(0, torch.tensor([9]).cuda(), good, good)  # plans cached: the op's own path
    pool.k_buffer[0].zero_()
    pool.v_buffer[0].zero_()
    dtype = opts.get("dtype", torch.bfloat16)
    k = rows(nk, heads=opts.get("heads", 2), dim=opts.get("dim", 8)).to(dtype)
    v = rows(nv).to(opts.get("v_dtype", dtype))
    loc = make_loc()
    if not opts.get("cpu_rows"):
        k, v = k.cuda(), v.cuda()
    if isinstance(loc, torch.Tensor):
        loc = loc.cuda()
    with pytest.raises(ValueError, match=match):
        pool.set_kv_buffer(0, loc, k, v)
    torch.cuda.synchronize()
    assert not pool.k_buffer[0].any() and not pool.v_buffer[0].any()


@pytest.mark.gpu
def test_compiled_op_refuses_shapes_the_pool_refuses_directly():
    """The op itself (no pool): rows of the right element count but another head shape, and
    tensors on two devices' worth of checks, are refused in C++."""
    from kvprof.kvcache.writers.cuda_fused import load_extension

    ext, error = load_extension()
    assert ext is not None, error
    buf = torch.zeros(16, 2, 8, dtype=torch.bfloat16, device="cuda")
    loc = torch.tensor([1, 2], device="cuda")
    odd = torch.ones(2, 4, 4, dtype=torch.bfloat16, device="cuda")  # 16 elements, not (2, 8)
    with pytest.raises(RuntimeError, match="must be \\[tokens, heads, dim\\]"):
        ext.store_kv(buf, buf.clone(), loc, odd, odd, 1.0, 1.0, 1)
    flat = torch.ones(2, 16, dtype=torch.bfloat16, device="cuda")
    ext.store_kv(buf, buf.clone(), loc, flat, flat, 1.0, 1.0, 1)  # [tokens, heads * dim] is fine
    torch.cuda.synchronize()
    assert buf[1:3].eq(1).all()
