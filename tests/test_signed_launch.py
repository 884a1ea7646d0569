"""The writers' signed launches (kvprof/kvcache/writers/triton_launch.py, ``SignedLaunch``, and the
C++ helper csrc/tensor_signature.cpp).

The helper's bytes must change with everything a launch reads of a tensor but its address. Each
Triton writer, run on a CPU against stand-in kernels that record every launch, must launch exactly
what its Python path launches -- the same grid, addresses, scalars, fixed ints, constexprs and
options -- over calls that vary every part of its key, and must take the signed path for the calls
it has seen. The GPU tests of the same writers (test_triton_launch.py, test_fused_writers.py,
test_rope_gpu.py, test_layouts_gpu.py) run the real kernels with the helper on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvprof.kvcache import signature as sig_
from kvprof.kvcache.writers import triton_launch as tl_


@pytest.fixture(scope="module")
def signature(signature_helper):
    return signature_helper.SIGNATURE


# -- the helper ------------------------------------------------------------------------------------
def test_equal_metadata_gives_equal_bytes_and_each_tensor_s_address(signature):
    a, b = torch.zeros(4, 2, 8, dtype=torch.bfloat16), torch.ones(4, 2, 8, dtype=torch.bfloat16)
    sa, sb = signature(a, b), signature(b, a)
    assert sa[0] == sb[0]
    assert sa[1] == (a.data_ptr(), b.data_ptr()) and sb[1] == (b.data_ptr(), a.data_ptr())


@pytest.mark.parametrize("other", [
    lambda t: t.float(),                        # dtype
    lambda t: t.reshape(8, 4),                  # shape
    lambda t: t.reshape(32),                    # rank
    lambda t: t[:3],                            # one size
    lambda t: t.transpose(0, 1),                # strides
    lambda t: t.as_strided((4, 8), (8, 1), 1),  # 16-byte alignment (2 bytes on)
    lambda t: t.as_strided((4, 8), (8, 1), 8),  # 16 bytes on, aligned again: equal
    lambda t: t.clone(),                        # another tensor alike: equal
])
def test_the_bytes_change_with_what_a_launch_reads(signature, other):
    base = torch.zeros(64, dtype=torch.bfloat16)[:32].view(4, 8)
    changed = other(base)
    same = (changed.dtype == base.dtype and changed.shape == base.shape and changed.stride() == base.stride()
            and (changed.data_ptr() % 16 == 0) == (base.data_ptr() % 16 == 0))
    assert (signature(base)[0] == signature(changed)[0]) == same
    assert signature(changed)[1] == (changed.data_ptr(),)


def test_what_it_does_not_read_takes_the_python_path(signature):
    t = torch.zeros(2)
    assert signature(t, torch.nn.Parameter(torch.zeros(2))) is None  # a subclass
    assert signature(t, 1.0) is None and signature(None) is None
    assert signature(torch.zeros([1] * 9)) is None  # rank above 8
    assert signature(torch.zeros(2, 2).to_sparse()) is None  # no strides
    assert signature(*[t] * 33) is None


# -- the writers against stand-in kernels ----------------------------------------------------------
class _Kept:
    def __init__(self, log: list, options: dict) -> None:
        self.log, self.options = log, options
        self.function, self.packed_metadata = object(), ("packed",)
        self.metadata = SimpleNamespace(launch_pdl=bool(options.get("launch_pdl", False)))

    def run(self, gx, gy, gz, stream, function, packed, h1, h2, meta, *args):
        self.log.append(((gx, gy, gz), args, tuple(sorted(self.options.items()))))


class _Kernel:
    """Stands in for a writer's kernel: its parameters; every launch recorded as (grid, the
    arguments with each tensor as its address, constexprs included, the launch options)."""

    def __init__(self, fn: Any, log: list) -> None:
        self.arg_names = list(fn.arg_names)
        self.do_not_specialize = list(getattr(fn, "do_not_specialize", []) or [])
        self.log = log

    def __getitem__(self, grid):
        def call(*args, **kw):
            options = {k: kw.pop(k) for k in ("num_warps", "launch_pdl", "enable_fp_fusion") if k in kw}
            consts = tuple(kw[n] for n in self.arg_names[len(args):])
            g = tuple(grid) + (1,) * (3 - len(grid))
            addresses = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
            self.log.append((g, addresses + consts, tuple(sorted(options.items()))))
            return _Kept(self.log, options)
        return call


def _launches(monkeypatch, module: Any, fn: Any, calls: list, make_writer, signed: bool) -> tuple[list, Any]:
    """Every launch of ``calls`` (each a callable taking the writer) through a fresh writer and
    launcher, with or without the signature helper."""
    log: list = []
    launcher = tl_.CompiledLauncher(_Kernel(fn, log), "stand-in", compiled=True, device=lambda: 0,
                                    stream=lambda d: 0, hooks=lambda: False)
    monkeypatch.setattr(module, "launcher_for", lambda f, name=None: launcher)
    if not signed:
        monkeypatch.setattr(sig_, "SIGNATURE", None)
    writer = make_writer()
    launcher.signed_at = []  # type: ignore[attr-defined]  # signed launches before each call
    for call in calls:
        launcher.signed_at.append(launcher.signed_calls)  # type: ignore[attr-defined]
        call(writer, fn)
    monkeypatch.undo()
    return log, launcher


def _same_launches(monkeypatch, signature, module, fn, calls, make_writer) -> None:
    """Each call, then all of them again: the same launches with and without the helper, and
    every call of the second round a signed launch (its plan and kernel kept in the first)."""
    python, _ = _launches(monkeypatch, module, fn, calls + calls, make_writer, signed=False)
    signed, launcher = _launches(monkeypatch, module, fn, calls + calls, make_writer, signed=True)
    assert len(python) == 2 * len(calls)
    assert signed == python
    assert launcher.signed_calls - launcher.signed_at[len(calls)] == len(calls)


def _call(*args: Any):
    """One call of the writer's ``write_unchecked`` (the writer's own paths, no contract checks)."""
    return lambda w, fn: w.write_unchecked(*args)


def _store(cache: torch.dtype) -> torch.dtype:
    """A cache buffer's dtype: fp8 caches are stored as bytes."""
    return torch.uint8 if cache in (torch.float8_e4m3fn, torch.float8_e5m2) else cache


def test_rope_triton_fused_launches_what_its_python_path_launches(monkeypatch, signature):
    from kvprof.kvcache.writers import rope_triton
    from kvprof.kvcache.writers.rope_reference import cos_sin_table

    cs = cos_sin_table(256, 128)
    calls = []
    for tokens in (1, 16, 17):
        for offset in (0, 1):  # q, k, v 16-byte aligned or not
            qkv = torch.randn(tokens, 10 * 128 + offset).to(torch.bfloat16)[:, offset:]
            q, k, v = (qkv[:, :1024].view(tokens, 8, 128), qkv[:, 1024:1152].view(tokens, 1, 128),
                       qkv[:, 1152:].view(tokens, 1, 128))
            loc, pos = torch.arange(tokens) * 2, torch.arange(tokens)
            for cache, scales in ((torch.bfloat16, [(None, None)]),
                                  (torch.float8_e4m3fn, [(0.5, 0.25), (0.3, 0.5), (None, 0.5), (0.5, 0.3)])):
                kb = torch.zeros(2 * tokens + 1, 1, 128, dtype=_store(cache))
                vb = torch.zeros_like(kb)
                for ks, vs in scales:
                    calls.append(_call(q, k, v, kb, vb, loc, pos, cs, True, cache, ks, vs))
    # GPT-J, a tensor scale
    qkv = torch.randn(4, 10 * 128).to(torch.bfloat16)
    q, k, v = qkv[:, :1024].view(4, 8, 128), qkv[:, 1024:1152].view(4, 1, 128), qkv[:, 1152:].view(4, 1, 128)
    kb, vb = torch.zeros(9, 1, 128, dtype=torch.uint8), torch.zeros(9, 1, 128, dtype=torch.uint8)
    loc, pos = torch.arange(4), torch.arange(4)
    for neox in (False, True):
        calls.append(_call(q, k, v, kb, vb, loc, pos, cs, neox, torch.float8_e4m3fn, torch.tensor(0.5), 0.3))
    _same_launches(monkeypatch, signature, rope_triton, rope_triton.kernel.rope_kv_kernel,
                              calls, rope_triton.RopeTritonFusedWriter)
    # v with a stride in its last dim is copied to unit stride: another tensor than the one signed
    v_strided = torch.randn(4, 1, 256).to(torch.bfloat16)[..., ::2]
    log, launcher = _launches(monkeypatch, rope_triton, rope_triton.kernel.rope_kv_kernel,
                              [lambda w, fn: w.write_unchecked(q, k, v_strided, kb, vb, loc, pos, cs, True,
                                                     torch.float8_e4m3fn, 0.5, 0.5)] * 3,
                              rope_triton.RopeTritonFusedWriter, signed=True)
    assert len(log) == 3 and launcher.signed_calls == 0


def test_the_rotary_alone_launches_what_its_python_path_launches(monkeypatch, signature):
    """The rotary kernel of rope_then_* (``TritonRope.rotate``): q, k, positions and the table
    signed, the kernel's placeholder pointers repeated as the Python path repeats them."""
    from kvprof.kvcache.writers import rope_triton
    from kvprof.kvcache.writers.rope_reference import cos_sin_table

    cs = cos_sin_table(256, 128)
    calls = []
    for tokens in (1, 16, 17):
        for offset in (0, 1):
            qkv = torch.randn(tokens, 10 * 128 + offset).to(torch.bfloat16)[:, offset:]
            q, k = qkv[:, :1024].view(tokens, 8, 128), qkv[:, 1024:1152].view(tokens, 1, 128)
            pos = torch.arange(tokens) * 3
            for neox in (True, False):
                calls.append(lambda w, fn, a=(q, k, pos, cs, neox): w.rotary.rotate(*a))
    _same_launches(monkeypatch, signature, rope_triton, rope_triton.kernel.rope_kv_kernel, calls,
                   lambda: rope_triton.RopeThenStoreWriter("index_put"))


@pytest.mark.parametrize("convert", ["auto", "hw"])  # hw: the GPU's fp8 cast decision, per stride
def test_triton_fused_launches_what_its_python_path_launches(monkeypatch, signature, convert):
    from kvprof.kvcache.writers import triton_fused

    calls = []
    for tokens in (1, 16, 33):
        for cache, scales in ((torch.bfloat16, [(None, None)]),
                              (torch.float8_e4m3fn, [(0.5, 0.5), (0.3, 0.25), (None, 2.0), (0.5, 0.3)])):
            k_buf = torch.zeros(2 * tokens + 1, 2, 64, dtype=_store(cache))
            v_buf = torch.zeros_like(k_buf)
            loc = torch.arange(tokens) * 2
            packed = torch.randn(tokens, 2, 64).to(torch.bfloat16)
            strided = torch.randn(tokens, 3, 2, 64).to(torch.bfloat16)[:, 1]  # rows with a token stride of 384
            odd = torch.randn(tokens, 136).to(torch.bfloat16)[:, :128].view(tokens, 2, 64)  # 136: other stride bits
            misaligned = torch.randn(tokens * 128 + 1).to(torch.bfloat16)[1:].view(tokens, 2, 64)
            for x in (packed, strided, odd, misaligned):
                for ks, vs in scales:
                    calls.append(lambda w, fn, a=(k_buf, v_buf, loc, x, x, cache, ks, vs): w.write_unchecked(*a))
    _same_launches(monkeypatch, signature, triton_fused, triton_fused.kernel.store_kv_kernel, calls,
                   lambda: triton_fused.TritonFusedWriter(convert=convert))
    # rows not contiguous after the token dim are copied: another tensor than the one signed
    inner = torch.randn(4, 64, 2).to(torch.bfloat16).transpose(1, 2)
    k_buf = torch.zeros(9, 2, 64, dtype=torch.bfloat16)
    log, launcher = _launches(monkeypatch, triton_fused, triton_fused.kernel.store_kv_kernel,
                              [lambda w, fn: w.write_unchecked(k_buf, k_buf.clone(), torch.arange(4), inner,
                                                               inner, torch.bfloat16)] * 3,
                              triton_fused.TritonFusedWriter, signed=True)
    assert len(log) == 3 and launcher.signed_calls == 0


def test_mla_triton_launches_what_its_python_path_launches(monkeypatch, signature):
    from kvprof.kvcache.writers import mla_triton

    calls = []
    for tokens in (1, 16, 17):
        for cache in (torch.bfloat16, torch.float8_e4m3fn):
            kv = torch.zeros(2 * tokens + 2, 1, 576, dtype=_store(cache))
            latent = torch.randn(tokens, 1, 576).to(torch.bfloat16)
            loc = torch.arange(tokens) + 1
            for skip in (0, -1, 3):
                calls.append(_call(kv, loc, latent[..., :512], latent[..., 512:], cache, skip))
    _same_launches(monkeypatch, signature, mla_triton, mla_triton._mla_store_kernel, calls,
                              mla_triton.MLATritonWriter)


def test_paged_triton_launches_what_its_python_path_launches(monkeypatch, signature):
    from kvprof.kvcache.writers import paged_triton

    calls = []
    for tokens in (1, 16, 17):
        for cache, scales in ((torch.bfloat16, (None, None)),
                              (torch.float8_e4m3fn, (torch.tensor([0.5]), torch.tensor([0.25])))):
            kc = torch.zeros(-(-(2 * tokens + 16) // 16), 16, 2, 64, dtype=_store(cache))
            vc = torch.zeros_like(kc)
            x = torch.randn(tokens, 2, 64).to(torch.bfloat16)
            slots = torch.arange(tokens) * 2
            calls.append(lambda w, fn, a=(kc, vc, slots, x, x, cache, *scales): w.write_unchecked(*a))
    _same_launches(monkeypatch, signature, paged_triton, paged_triton._paged_store_kernel, calls,
                              paged_triton.PagedTritonWriter)


def test_a_replaced_kernel_a_hook_or_the_switch_take_the_python_path(monkeypatch, signature):
    """A SignedLaunch launches only what the launcher would: not for another kernel object, not
    with a launch hook set, not with the launcher switched off, not on another current device."""
    log: list = []
    fn = SimpleNamespace(arg_names=["x", "n", "B"], do_not_specialize=[])
    hooks = [False]
    device = [0]
    launcher = tl_.CompiledLauncher(_Kernel(fn, log), "stand-in", compiled=True, device=lambda: device[0],
                                    stream=lambda d: 0, hooks=lambda: hooks[0])
    x = torch.zeros(4)
    launcher.launch((1,), (x, 4), (8,), 4)
    kept = launcher.signed((1,), (x, 4), (8,), 4, fn=fn)
    assert kept is not None and kept(fn, (x.data_ptr(), 4, 8)) and launcher.signed_calls == 1
    assert not kept(SimpleNamespace(), (x.data_ptr(), 4, 8))
    hooks[0] = True
    assert not kept(fn, (x.data_ptr(), 4, 8))
    hooks[0] = False
    device[0] = 1
    assert not kept(fn, (x.data_ptr(), 4, 8))
    device[0] = 0
    before = tl_.set_enabled(False)
    try:
        assert not kept(fn, (x.data_ptr(), 4, 8))
    finally:
        tl_.set_enabled(before)
    assert launcher.signed_calls == 1 and len(log) == 2
    assert launcher.signed((1,), (x, 5), (9,), 4) is None  # nothing kept for those constexprs


# -- on a GPU: the real kernels --------------------------------------------------------------------
def _gpu_cases():
    """(writer factory, a call on fresh zeroed caches -> the caches) for each Triton writer, bf16 and fp8."""
    from kvprof.kvcache.dtypes import store_dtype_for
    from kvprof.kvcache.writers.mla_triton import MLATritonWriter
    from kvprof.kvcache.writers.paged_triton import PagedTritonWriter
    from kvprof.kvcache.writers.rope_reference import cos_sin_table
    from kvprof.kvcache.writers.rope_triton import RopeTritonFusedWriter
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    gen = torch.Generator().manual_seed(3)
    cs = cos_sin_table(512, 128).cuda()
    for tokens in (1, 17, 64):
        loc = (torch.randperm(400, generator=gen)[:tokens] + 1).cuda()
        for cache, scale in ((torch.bfloat16, None), (torch.float8_e4m3fn, 0.5), (torch.float8_e4m3fn, 0.3)):
            store = store_dtype_for(cache)
            x = torch.randn(tokens, 8, 128, generator=gen).to(torch.bfloat16).cuda()
            qkv = torch.randn(tokens, 10 * 128, generator=gen).to(torch.bfloat16).cuda()

            def store_kv(w, x=x, loc=loc, cache=cache, scale=scale, store=store):
                bufs = [torch.zeros(512, 8, 128, dtype=store, device="cuda") for _ in range(2)]
                w.write_unchecked(*bufs, loc, x, x, cache, scale, scale)
                return bufs

            def rope(w, qkv=qkv, loc=loc, cache=cache, scale=scale, store=store, tokens=tokens):
                q = qkv.clone()  # rotated in place: each call from the same input
                bufs = [torch.zeros(512, 1, 128, dtype=store, device="cuda") for _ in range(2)]
                w.write_unchecked(q[:, :1024].view(tokens, 8, 128), q[:, 1024:1152].view(tokens, 1, 128),
                                  q[:, 1152:].view(tokens, 1, 128), *bufs, loc, torch.arange(tokens, device="cuda"),
                                  cs, True, cache, scale, scale)
                return [q, *bufs]

            def mla(w, x=x, loc=loc, cache=cache, store=store):
                kv = torch.zeros(512, 1, 576, dtype=store, device="cuda")
                latent = torch.cat([x.view(x.shape[0], 1, -1)[..., :576]], dim=-1)
                w.write_unchecked(kv, loc, latent[..., :512], latent[..., 512:], cache, 0)
                return [kv]

            def paged(w, x=x, loc=loc, cache=cache, scale=scale, store=store):
                caches = [torch.zeros(32, 16, 8, 128, dtype=store, device="cuda") for _ in range(2)]
                scales = (None, None) if scale is None else (torch.tensor([scale], device="cuda"),) * 2
                w.write_unchecked(*caches, loc, x, x, cache, *scales)
                return caches

            yield "triton_fused", TritonFusedWriter, store_kv, (tokens, cache, scale)
            yield "rope_triton_fused", RopeTritonFusedWriter, rope, (tokens, cache, scale)
            if scale != 0.3:
                yield "mla_triton", MLATritonWriter, mla, (tokens, cache)
                yield "paged_triton", PagedTritonWriter, paged, (tokens, cache, scale)


@pytest.mark.gpu
def test_gpu_signed_launches_write_the_bytes_of_the_python_path(monkeypatch, signature):
    before = sum(c.get("signed", 0) for c in tl_.launch_counts().values())
    for name, make, call, case in _gpu_cases():
        w = make()
        signed = [call(w) for _ in range(3)]  # the first keeps the kernel, the others are signed launches
        monkeypatch.setattr(sig_, "SIGNATURE", None)
        python = call(make())
        monkeypatch.undo()
        torch.cuda.synchronize()
        for out in signed:
            assert all(torch.equal(a, b) for a, b in zip(out, python)), (name, case)
    after = sum(c.get("signed", 0) for c in tl_.launch_counts().values())
    assert after - before >= 2 * len(list(_gpu_cases()))
