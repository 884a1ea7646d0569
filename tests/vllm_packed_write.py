"""vLLM 0.32's packed cache written by vLLM's own op and by the plugin's route, byte for byte (run by
tests/test_vllm_plugin.py in vLLM's interpreter under TRITON_INTERPRET=1: ``python
tests/vllm_packed_write.py WRITER``; prints one JSON line).

The cache is ``[num_blocks, num_kv_heads, block_size, 2*head_size]`` as vLLM allocates it for its
CUDA backends. vLLM's op is ``TritonAttentionImpl.do_kv_cache_update`` itself (the real class and
method, as the plugin found it unhooked), calling vLLM's own Triton kernel
``reshape_and_cache_kernel_flash``: on a machine without a GPU vLLM swaps triton for a stand-in,
so its module's source is run again here with the real triton (its interpreter) and a platform
that is neither ROCm nor CUDA (its launch then asks no CUDA device for its capability); nothing
else of the kernel or its launch changes. The route is the same method hooked by the plugin with
``WRITER`` named. Each case writes random rows (bf16, fp16, fp32; heads and head sizes vary)
at random slots with -1 padding among them, from strided key/value views as vLLM passes them,
into a cache filled with random bytes (so a write to a wrong row shows).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch
import triton  # noqa: F401  (the real package; vLLM's stand-in is only in vllm.triton_utils)
import vllm.v1.attention.backends.triton_attn as triton_attn
import vllm.v1.attention.ops.triton_reshape_and_cache_flash as ops_mod
from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

STAND_IN = "from vllm.triton_utils import tl, triton"
source = Path(ops_mod.__file__).read_text()
if STAND_IN not in source:
    sys.exit(f"{ops_mod.__file__} no longer imports triton as {STAND_IN!r}: this check needs updating")
real = types.ModuleType(ops_mod.__name__ + "_interpreted")
real.__file__ = ops_mod.__file__
exec(compile(source.replace(STAND_IN, "import triton\nimport triton.language as tl"), ops_mod.__file__, "exec"),
     real.__dict__)
real.current_platform = types.SimpleNamespace(is_rocm=lambda: False, is_xpu=lambda: True,  # type: ignore[attr-defined]
                                              fp8_dtype=lambda: torch.float8_e4m3fn)
triton_attn.triton_reshape_and_cache_flash = real.triton_reshape_and_cache_flash  # what the method calls

from kvprof.integrations import vllm as plugin  # noqa: E402

writer = sys.argv[1]
plugin.STATE.writer_name = writer
plugin.hook_impl(TritonAttentionImpl)
method = TritonAttentionImpl.do_kv_cache_update
assert getattr(method, "_kvprof_vllm_hook", False), "the plugin did not hook TritonAttentionImpl"
own = method.__wrapped__

cases = []
gen = torch.Generator().manual_seed(0)
for dtype, heads, dim, blocks, block_size, tokens in ((torch.bfloat16, 2, 64, 6, 16, 19),
                                                      (torch.float16, 4, 128, 3, 16, 9),
                                                      (torch.float32, 1, 80, 5, 8, 13)):
    impl = TritonAttentionImpl(num_heads=heads * 2, head_size=dim, scale=dim ** -0.5, num_kv_heads=heads,
                               alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto")
    layer = types.SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1),
                                  layer_name="model.layers.3.self_attn.attn")
    cache = torch.randint(0, 255, (blocks, heads, block_size, 2 * dim * dtype.itemsize), dtype=torch.uint8,
                          generator=gen).view(dtype)
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens].to(torch.int64)
    slots[::5] = -1
    qkv = torch.randn(tokens + 3, 3, heads, dim, generator=gen).to(dtype)  # strided views, padded rows
    key, value = qkv[:, 1], qkv[:, 2]
    theirs, ours = cache.clone(), cache.clone()
    own(impl, layer, key, value, theirs, slots)
    before = dict(plugin.STATE.paths)
    method(impl, layer, key, value, ours, slots)
    paths = {k: v - before.get(k, 0) for k, v in plugin.STATE.paths.items() if v != before.get(k, 0)}
    changed = int((theirs.view(torch.uint8) != cache.view(torch.uint8)).any(dim=-1).sum())
    cases.append({"dtype": str(dtype), "heads": heads, "dim": dim, "paths": paths, "rows_changed": changed,
                  "expected_rows": int((slots >= 0).sum()) * heads,
                  "same": bool(torch.equal(theirs.view(torch.uint8), ours.view(torch.uint8)))})
print(json.dumps({"cases": cases, "fallbacks": plugin.STATE.fallbacks}))
