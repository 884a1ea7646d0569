"""The compiled launcher of kvprof's Triton kernels (kvprof/kvcache/writers/triton_launch.py).

On a CPU the launcher runs against a stand-in kernel that records Triton's path (``kernel[grid](...)``)
and the compiled path (``CompiledKernel.run``): which calls reuse a kept kernel, which go back to
Triton with which reason, and that a key never joins two calls Triton would specialise apart.
The gpu-marked tests run the real kernels: the same bytes with the launcher on and off,
and the kernel a key keeps is the one in Triton's own cache."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvprof.kvcache.writers import triton_launch as tl_
from kvprof.kvcache.writers.triton_launch import FIRST, HOOK, INTERPRETED, UNKEYED, CompiledLauncher, key_source


class FakeCompiled:
    def __init__(self, pdl: bool, log: list) -> None:
        self.metadata = SimpleNamespace(launch_pdl=pdl)
        self.function = object()
        self.packed_metadata = ("packed",)
        self.log = log

    def run(self, *args):
        self.log.append(("compiled", args))


class FakeJit:
    """Stands in for a JITFunction: ``fake[grid](*args, **kw)`` is Triton's path."""

    arg_names = ["out", "n", "m", "x", "A", "B"]
    do_not_specialize = ["m"]

    def __init__(self) -> None:
        self.log: list = []
        self.kernels: list[FakeCompiled] = []

    def __getitem__(self, grid):
        def call(*args, **kw):
            self.log.append(("jit", grid, args, kw))
            k = FakeCompiled(bool(kw.get("launch_pdl", False)), self.log)
            self.kernels.append(k)
            return k
        return call


def make(hooks: bool = False, compiled: bool = True) -> tuple[FakeJit, CompiledLauncher]:
    fn = FakeJit()
    return fn, CompiledLauncher(fn, "fake", compiled=compiled, device=lambda: 0, stream=lambda d: 1234 + d,
                                hooks=lambda: hooks)


def kinds(fn: FakeJit) -> list[str]:
    return [e[0] for e in fn.log]


def test_second_call_with_the_same_key_takes_the_compiled_path_with_triton_s_argument_order():
    fn, la = make()
    out = torch.zeros(64)
    la.launch((3, 2), (out, 5, 7, 0.5), (16, True), 4, pdl=True)
    la.launch((9,), (out, 5, 7, 0.5), (16, True), 4, pdl=True)
    assert kinds(fn) == ["jit", "compiled"]
    grid, args, kw = fn.log[0][1:]
    assert grid == (3, 2) and args == (out, 5, 7, 0.5)
    assert kw == {"A": 16, "B": True, "num_warps": 4, "launch_pdl": True}
    compiled = fn.log[1][1]
    k = fn.kernels[0]
    # grid padded to three, the current stream, the kernel's function and metadata, no hooks, then
    # every parameter in order (constexprs after the runtime arguments, as JITFunction.run passes them)
    # (a tensor as its address, read once for the key)
    assert compiled == (9, 1, 1, 1234, k.function, k.packed_metadata, None, None, None, out.data_ptr(), 5, 7, 0.5,
                        16, True)
    assert la.counts() == {"compiled": 1, "signed": 0, "triton": {FIRST: 1}, "kernels": 1}


@pytest.mark.parametrize("change", ["alignment", "dtype", "int_one", "int_16", "int64", "const", "warps", "pdl",
                                    "fusion"])
def test_anything_triton_specialises_on_makes_a_new_key(change):
    fn, la = make()
    base = torch.zeros(64, dtype=torch.float32)
    args, consts, warps, pdl, fusion = (base, 5, 7, 0.5), (16, True), 4, False, True
    la.launch((1,), args, consts, warps, pdl, fusion)
    if change == "alignment":
        args = (base[1:], 5, 7, 0.5)  # 4 bytes past a 16-byte boundary
    elif change == "dtype":
        args = (base.view(torch.int32), 5, 7, 0.5)
    elif change == "int_one":
        args = (base, 1, 7, 0.5)
    elif change == "int_16":
        args = (base, 32, 7, 0.5)
    elif change == "int64":
        args = (base, 5, 1 << 40, 0.5)  # not specialised, but its type is int64 now
    elif change == "const":
        consts = (32, True)
    elif change == "warps":
        warps = 8
    elif change == "pdl":
        pdl = True
    else:
        fusion = False
    la.launch((1,), args, consts, warps, pdl, fusion)
    assert kinds(fn) == ["jit", "jit"]
    assert la.counts()["triton"] == {FIRST: 2}


class HostOrCuda:
    """A tensor stand-in that says it is a CUDA tensor (no CUDA device on the CPU suite)."""

    dtype = torch.float32
    is_cuda = True

    def data_ptr(self) -> int:
        return 4096


def test_a_host_tensor_where_a_cuda_one_was_takes_triton_s_path():
    # the launcher gets addresses, not tensors: a host tensor must not reach a kept CUDA kernel
    fn, la = make()
    la.launch((1,), (HostOrCuda(), 5, 7, 0.5), (16, True), 4)
    la.launch((1,), (torch.zeros(1024)[:64], 5, 7, 0.5), (16, True), 4)
    assert kinds(fn) == ["jit", "jit"]
    assert la.counts()["triton"] == {FIRST: 2}


# CudaLauncher.__call__ as Triton 3.3, 3.4 and 3.5-3.6 wrote it (backends/nvidia/driver.py), and
# the form 3.7 on has (a generic launch function taking the kernel's signature): the direct call
# must pass what each passes, or not be taken
LAUNCHERS = {
    "3.3": """
def __call__(self, gridX, gridY, gridZ, stream, function, *args):
    if self.global_scratch_size > 0:
        global_scratch = _allocation._allocator(gridX * gridY * gridZ * self.global_scratch_size, 0, stream)
    else:
        global_scratch = None
    self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, global_scratch, *args)
""",
    "3.4": """
def __call__(self, gridX, gridY, gridZ, stream, function, *args):
    if self.global_scratch_size > 0:
        global_scratch = _allocation._allocator(gridX * self.num_ctas * self.global_scratch_size, 0, stream)
    else:
        global_scratch = None
    self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                global_scratch, *args)
""",
    "3.6": """
def __call__(self, gridX, gridY, gridZ, stream, function, *args):
    def allocate_scratch(size, align, allocator):
        if size > 0:
            return allocator.get()(gridX * gridY * gridZ * self.num_ctas * size, align, stream)
        return None
    global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align, _allocation._allocator)
    profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align,
                                       _allocation._profile_allocator)
    self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                global_scratch, profile_scratch, *args)
""",
    "3.9": """
def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, launch_enter_hook,
             launch_exit_hook, *args):
    global_scratch = None
    profile_scratch = None
    self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, global_scratch,
                profile_scratch, self.arg_annotations, self.kernel_signature, args)
""",
}


def fake_cuda_launcher(version: str, scratch: int = 0) -> object:
    scope: dict = {"_allocation": SimpleNamespace(_allocator=None, _profile_allocator=None)}
    exec(LAUNCHERS[version], scope)  # noqa: S102
    cls = type("CudaLauncher", (), {"__call__": scope["__call__"]})
    run = cls()
    run.calls = []
    run.launch = lambda *a: run.calls.append(a)
    run.global_scratch_size = scratch
    run.global_scratch_align = run.profile_scratch_align = 1
    run.profile_scratch_size = 0
    run.num_ctas = 1
    run.launch_cooperative_grid = False
    run.launch_pdl = True
    run.arg_annotations = run.kernel_signature = None
    return run


@pytest.mark.parametrize("version", ["3.3", "3.4", "3.6"])
def test_the_direct_launch_passes_what_triton_s_launcher_passes(version):
    run = fake_cuda_launcher(version)
    found = tl_.direct_launch(run)
    assert found is not None
    launch, prefix = found
    rest = (("packed",), None, None, None, 4096, 5, 7, 0.5, 16, True)
    run(3, 1, 1, 77, "fn", *rest)  # Triton's own call
    launch(3, 1, 1, 77, "fn", *prefix, *rest)  # the direct one
    assert run.calls[0] == run.calls[1]


@pytest.mark.parametrize("version, scratch", [("3.9", 0), ("3.6", 128)])
def test_no_direct_launch_where_the_launcher_has_another_form_or_allocates(version, scratch):
    assert tl_.direct_launch(fake_cuda_launcher(version, scratch)) is None
    assert tl_.direct_launch(FakeCompiled(False, []).run) is None


def test_a_kept_kernel_with_a_direct_launch_is_launched_through_it():
    fn, la = make()
    run = fake_cuda_launcher("3.6")
    orig = fn.__getitem__

    def with_launcher(grid):
        def call(*args, **kw):
            k = orig(grid)(*args, **kw)
            k.run = run
            return k
        return call

    fn.__class__ = type("Direct", (FakeJit,), {"__getitem__": lambda self, grid: with_launcher(grid)})
    out = torch.zeros(64)
    for _ in range(3):
        la.launch((2,), (out, 5, 7, 0.5), (16, True), 4, pdl=True)
    k = fn.kernels[0]
    expected = (2, 1, 1, 1234, k.function, False, True, None, None, k.packed_metadata, None, None, None,
                out.data_ptr(), 5, 7, 0.5, 16, True)
    assert run.calls == [expected, expected]
    assert la.counts() == {"compiled": 2, "signed": 0, "triton": {FIRST: 1}, "kernels": 1}


def test_fixed_ints_follow_the_arguments_in_order_and_are_keyed_by_value():
    # (out, n) keyed per call; m and x given as fixed: the launch gets every parameter in the
    # kernel's order, the same values find the kept kernel, any other value makes a new key
    fn, la = make()
    out = torch.zeros(64)
    la.launch((1,), (out, 5), (16, True), 4, False, True, (7, 3))
    la.launch((1,), (out, 5), (16, True), 4, False, True, (7, 3))
    assert kinds(fn) == ["jit", "compiled"]
    assert fn.log[0][2] == (out, 5, 7, 3)
    assert fn.log[1][1][9:] == (out.data_ptr(), 5, 7, 3, 16, True)
    la.launch((1,), (out, 5), (16, True), 4, False, True, (8, 3))  # m is not specialised, but keyed by value
    la.launch((1,), (out, 5), (16, True), 4, False, True, (8, 3))
    assert kinds(fn)[2:] == ["jit", "compiled"]
    assert la.counts() == {"compiled": 2, "signed": 0, "triton": {FIRST: 2}, "kernels": 2}


@pytest.mark.parametrize("odd", [3.0, True, np.int64(3)], ids=["float", "bool", "numpy"])
def test_a_fixed_value_that_is_no_python_int_takes_triton_s_path_and_is_never_kept(odd):
    fn, la = make()
    out = torch.zeros(64)
    for _ in range(2):
        la.launch((1,), (out, 5), (16, True), 4, False, True, (7, odd))
    assert kinds(fn) == ["jit", "jit"]
    assert la.counts() == {"compiled": 0, "signed": 0, "triton": {UNKEYED: 2}, "kernels": 0}


def test_a_float_equal_to_a_kept_fixed_int_goes_back_to_triton_when_the_launcher_refuses_it():
    fn, la = make()
    out = torch.zeros(64)
    la.launch((1,), (out, 5), (16, True), 4, False, True, (7, 3))
    k = fn.kernels[0]

    def parse(*args):  # Triton's C launcher parses every argument before it launches
        if any(type(a) is float for a in args[9:13]):
            raise TypeError("'float' object cannot be interpreted as an integer")
        fn.log.append(("compiled", args))

    k.run = parse
    la._kernels = {key: (parse, *rest) for key, (_, *rest) in la._kernels.items()}
    la.launch((1,), (out, 5), (16, True), 4, False, True, (7, 3.0))  # hash(3.0) == hash(3): the kept kernel
    la.launch((1,), (out, 5), (16, True), 4, False, True, (7, 3))
    assert kinds(fn) == ["jit", "jit", "compiled"]
    assert fn.log[1][2] == (out, 5, 7, 3.0)  # Triton gets the float as it was given
    assert la.counts()["triton"] == {FIRST: 1, UNKEYED: 1}


def test_an_unspecialised_int_may_change_within_its_type():
    fn, la = make()
    out = torch.zeros(8)
    for m in (7, 1, 16, 2**31 - 1, -5):  # do_not_specialize: ==1 and %16 are not in Triton's key either
        la.launch((1,), (out, 5, m, 0.5), (16, True), 4)
    assert kinds(fn) == ["jit"] + ["compiled"] * 4


def test_an_argument_of_another_kind_goes_back_to_triton_and_is_counted():
    fn, la = make()
    out = torch.zeros(8)
    la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    la.launch((1,), (out, 5.0, 7, 0.5), (16, True), 4)  # a float where the first call had an int
    la.launch((1,), (None, 5, 7, 0.5), (16, True), 4)  # no tensor where one was
    assert kinds(fn) == ["jit", "jit", "jit"]
    assert la.counts()["triton"] == {FIRST: 1, UNKEYED: 2}


def test_a_launch_hook_takes_triton_s_path_and_nothing_is_kept():
    fn = FakeJit()
    hooked = [False]
    la = CompiledLauncher(fn, "fake", compiled=True, device=lambda: 0, stream=lambda d: 0, hooks=lambda: hooked[0])
    out = torch.zeros(8)
    la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    hooked[0] = True
    la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    hooked[0] = False
    la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    assert kinds(fn) == ["jit", "jit", "compiled"]
    assert la.counts()["triton"] == {FIRST: 1, HOOK: 1}


def test_an_empty_hook_chain_is_no_hook_and_a_chain_with_a_call_is():
    # Triton 3.5 on: launch_enter_hook / launch_exit_hook are HookChain objects, never None; an empty chain does
    # nothing, so it must not send every launch through Triton's path (it did on an H100 with Triton 3.6).
    # Up to 3.4 the knob is None or a callable
    from triton.knobs import HookChain

    from kvprof.kvcache.writers.triton_launch import hook_set

    chain = HookChain()
    assert not hook_set(chain) and not hook_set(None)
    chain.add(lambda *a: None)
    assert hook_set(chain) and hook_set(lambda *a: None)
    # and the launcher's own check, as _setup builds it from Triton's knobs
    from triton import knobs

    la = CompiledLauncher(lambda: None, "fake", compiled=True, device=lambda: 0, stream=lambda d: 0)
    assert la._setup() is None and la._hooks is not None
    assert not la._hooks() or knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls
    hook = lambda *a: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert la._hooks()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not la._hooks()


def test_interpreter_and_the_switch_always_take_triton_s_path(monkeypatch):
    fn, la = make(compiled=False)
    out = torch.zeros(8)
    for _ in range(3):
        la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    assert kinds(fn) == ["jit"] * 3 and la.counts()["triton"] == {INTERPRETED: 3}
    fn, la = make()
    la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)  # kept
    monkeypatch.setattr(tl_, "_ON", True)
    tl_.set_enabled(False)
    for _ in range(2):
        la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    tl_.set_enabled(True)
    la.launch((1,), (out, 5, 7, 0.5), (16, True), 4)
    assert kinds(fn) == ["jit"] * 3 + ["compiled"]
    assert la.counts()["triton"] == {FIRST: 1, tl_.DISABLED: 2}


def test_the_environment_switch_is_read_at_import(monkeypatch):
    for value, off in (("0", True), ("off", True), ("1", False), ("", False)):
        monkeypatch.setenv(tl_.ENV_DISABLE, value)
        assert tl_._disabled_by_env() is off
    code = "from kvprof.kvcache.writers import triton_launch as t; print(t._ON)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, tl_.ENV_DISABLE: "0"})
    assert r.stdout.strip() == "False", r.stderr


def test_a_kernel_whose_pdl_attribute_differs_is_never_reused():
    fn, la = make()
    out = torch.zeros(8)
    orig = fn.__getitem__

    def wrong(grid):
        def call(*args, **kw):
            k = orig(grid)(*args, **kw)
            k.metadata.launch_pdl = not k.metadata.launch_pdl
            return k
        return call

    fn.__class__ = type("Wrong", (FakeJit,), {"__getitem__": lambda self, grid: wrong(grid)})
    for _ in range(2):
        la.launch((1,), (out, 5, 7, 0.5), (16, True), 4, pdl=True)
    assert kinds(fn) == ["jit", "jit"]


def test_a_parameter_count_mismatch_is_refused_in_one_line():
    fn, la = make()
    with pytest.raises(TypeError, match="2 arguments and 2 constexprs given, the kernel has 6 parameters"):
        la.launch((1,), (torch.zeros(4), 5), (16, True), 4)


def triton_int_spec(v: int, specialize: bool) -> tuple:
    """Triton 3.x's specialisation of an int argument (runtime/jit.py, native_specialize_impl)."""
    if specialize and v == 1:
        return ("constexpr", 1)
    kind = "i32" if -(2**31) <= v < 2**31 else ("u64" if v >= 2**63 else "i64")
    return (kind, "D" if specialize and v % 16 == 0 else None)


ints = st.one_of(st.integers(-(2**33), 2**33), st.sampled_from([0, 1, 16, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1,
                                                               2**63 - 1, 2**63, 2**64 - 16]))


@settings(max_examples=60, deadline=None)
@given(a=ints, b=ints, spec=st.booleans())
def test_equal_keys_mean_equal_triton_specialisations(a, b, spec):
    scope = {"cls": tl_._int_class, "type": type}
    exec(key_source((a,), (spec,)), scope)  # noqa: S102
    key = scope["key"]
    assert key((a,))[1] == (a,)  # an int goes to the launch as it is
    if key((a,))[0] == key((b,))[0]:
        assert triton_int_spec(a, spec) == triton_int_spec(b, spec)


def test_triton_versions_read():
    assert tl_.triton_version("3.6.0") == (3, 6) and tl_.triton_version("3.10.0+git1") == (3, 10)
    assert tl_.triton_version("3.3.0rc1") == (3, 3) and tl_.triton_version("nightly") == (0, 0)


def test_launcher_for_follows_a_replaced_kernel():
    a, b = FakeJit(), FakeJit()
    assert tl_.launcher_for(a) is tl_.launcher_for(a)
    assert tl_.launcher_for(b) is not tl_.launcher_for(a)


def test_the_writers_launch_through_it_under_the_interpreter():
    """TRITON_INTERPRET=1 (the CPU suite): triton_fused's write goes through its launcher, which
    counts Triton's path under the interpreter's reason and keeps nothing."""
    from kvprof.kvcache.writers.triton_convert import triton

    if triton is None:
        pytest.skip("triton not importable")
    from kvprof.kvcache.writers import triton_kernel
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    if not triton_kernel.interpreted():
        pytest.skip("compiled Triton on a GPU: see the gpu tests")
    la = tl_.launcher_for(triton_kernel.store_kv_kernel)
    before = la.counts()["triton"].get(INTERPRETED, 0)
    k_buf = torch.zeros(8, 1, 16, dtype=torch.bfloat16)
    v_buf = torch.zeros_like(k_buf)
    x = torch.randn(2, 1, 16).to(torch.bfloat16)
    TritonFusedWriter().write(k_buf, v_buf, torch.tensor([3, 5]), x, x, torch.bfloat16)
    assert torch.equal(k_buf[3], x[0]) and torch.equal(v_buf[5], x[1])
    assert la.counts()["triton"][INTERPRETED] == before + 1 and la.counts()["kernels"] == 0


# -- on a GPU: the real kernels --------------------------------------------------------------------
def _writes(seed: int):
    """Calls that vary every key part a write can: token counts (1, a multiple of 16, others),
    16-byte-misaligned input views, fp8 with scales."""
    gen = torch.Generator().manual_seed(seed)
    for tokens in (1, 2, 16, 17, 64, 1, 300):
        for offset in (0, 1):
            for cache in (torch.bfloat16, torch.float8_e4m3fn):
                yield tokens, offset, cache, gen


@pytest.mark.gpu
def test_gpu_the_same_bytes_with_and_without_the_launcher(monkeypatch):
    from kvprof.kvcache.dtypes import store_dtype_for
    from kvprof.kvcache.writers import triton_kernel
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    la = tl_.launcher_for(triton_kernel.store_kv_kernel)
    fast_before = la.counts()["compiled"]
    for tokens, offset, cache, gen in _writes(0):
        flat = torch.randn(tokens * 2 * 128 + offset, generator=gen).to(torch.bfloat16).cuda()
        k = flat[offset: offset + tokens * 128].view(tokens, 1, 128)
        v = flat[offset + tokens * 128: offset + 2 * tokens * 128].view(tokens, 1, 128)
        loc = torch.randperm(1000, generator=gen)[:tokens].cuda()
        scale = 0.5 if cache != torch.bfloat16 else None
        outs = []
        for on in (True, False):
            monkeypatch.setattr(tl_, "_ON", on)
            w = TritonFusedWriter()
            bufs = [torch.zeros(1024, 1, 128, dtype=store_dtype_for(cache), device="cuda") for _ in range(2)]
            for _ in range(2):  # with the launcher on, the second call takes the compiled path
                w.write(bufs[0], bufs[1], loc, k, v, cache, scale, scale)
            outs.append(bufs)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(*outs)), (tokens, offset, cache)
    assert la.counts()["compiled"] > fast_before


@pytest.mark.gpu
def test_gpu_a_kept_kernel_is_the_one_in_triton_s_cache():
    from kvprof.kvcache.writers import triton_kernel
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    la = tl_.launcher_for(triton_kernel.store_kv_kernel)
    w = TritonFusedWriter()
    buf = torch.zeros(256, 1, 128, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(3, 1, 128, device="cuda").to(torch.bfloat16)
    w.write(buf, buf.clone(), torch.arange(3, device="cuda"), x, x, torch.bfloat16)
    torch.cuda.synchronize()
    entry = triton_kernel.store_kv_kernel.device_caches[torch.cuda.current_device()]
    triton_kernels = entry[0] if isinstance(entry, tuple) else entry
    kept = {id(run) for run, *_ in la._kernels.values()}
    cached = {id(k.run) for k in triton_kernels.values() if hasattr(k, "run")}
    assert kept and kept <= cached


@pytest.mark.gpu
def test_gpu_graph_capture_of_the_compiled_path():
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    w = TritonFusedWriter()
    k_buf = torch.zeros(512, 8, 128, dtype=torch.bfloat16, device="cuda")
    v_buf = torch.zeros_like(k_buf)
    x = torch.randn(64, 8, 128, device="cuda").to(torch.bfloat16)
    loc = torch.randperm(511, device="cuda")[:64] + 1
    w.write(k_buf, v_buf, loc, x, x, torch.bfloat16)  # Triton's path: kept
    k_buf.zero_()
    v_buf.zero_()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.write(k_buf, v_buf, loc, x, x, torch.bfloat16)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(k_buf[loc], x) and torch.equal(v_buf[loc], x)


def test_the_counts_read_as_one_line_old_runs_included():
    counts = {"a": {"compiled": 10, "signed": 8, "triton": {FIRST: 2}, "kernels": 2},
              "b": {"compiled": 5, "triton": {FIRST: 1, HOOK: 3}, "kernels": 1}}  # a run from before signed launches
    assert tl_.describe_counts(counts) == (
        "kvprof's Triton launches: 8 signed, 7 compiled by key, 6 through Triton "
        f"({FIRST} 3; {HOOK} 3)")
    assert tl_.describe_counts({}) == "kvprof's Triton launches: 0 signed, 0 compiled by key, 0 through Triton"
