"""Where vLLM's CPU backend writes a token's K and V in its packed cache, per instruction set.

Run in vLLM's interpreter (``.venv-vllm/bin/python lab/vllm_cpu_cache_layout.py``): vLLM's own
``cpu_attn_reshape_and_cache`` writes 4 tokens (of 5, one padding) of 2 heads x 64 into a zeroed
``[4 blocks, 2 heads, 32, 2*64]`` bf16 cache, viewed as the CPU backend views it (per block and
head, ``block_size`` K rows then ``block_size`` V rows), once per ISA it accepts. Printed per ISA:
whether each token's K and V landed as plain rows at its slot (what kvprof's paged writers
write), and how many 64-element rows of the cache changed (8 K rows + 8 V rows if plain).
docs/engines.md quotes its output.
"""

from __future__ import annotations

import torch
from vllm import _custom_ops as ops

B, H, N, D = 4, 2, 32, 64
torch.manual_seed(0)
key = torch.randn(5, H, D).to(torch.bfloat16)
value = torch.randn(5, H, D).to(torch.bfloat16)
slots = torch.tensor([3, 33, -1, 64, 127])
print("this CPU: AMX", torch.cpu._is_amx_tile_supported(), "AVX-512", torch.cpu._is_avx512_supported())
for isa in ("vec", "vec16", "amx"):
    cache = torch.zeros(B, H, N, 2 * D, dtype=torch.bfloat16)
    kc, vc = cache.view(B, H, 2 * N, D).chunk(2, dim=2)
    try:
        ops.cpu_attn_reshape_and_cache(key, value, kc, vc, slots, isa)
    except Exception as exc:  # noqa: BLE001 - an ISA this build or CPU refuses
        print(f"{isa}: refused ({str(exc).splitlines()[0][:120]})")
        continue
    plain = all(torch.equal(kc[s // N, h, s % N], key[t, h]) and torch.equal(vc[s // N, h, s % N], value[t, h])
                for t, s in enumerate(slots.tolist()) if s >= 0 for h in range(H))
    changed = int((cache.view(B, H, 2 * N, D) != 0).any(-1).sum())
    print(f"{isa}: plain rows at their slots: {plain}; rows changed: {changed} (plain: 16)")
