"""lab/ablation_kernel.py: the dependent-op yardstick of lab/fp8_ablation.py leaves the copy's bits
unchanged (else the ablation would time something other than a longer chain), and its copy of
the writer's kernel writes what the writer writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ablation_kernel as ak  # noqa: E402
from kvprof.kvcache.writers import triton_kernel as tk  # noqa: E402
from kvprof.kvcache.writers.triton_fused import KINDS  # noqa: E402


def test_chain_mode_bits_stay_above_the_writers_flags():
    writer_bits = (tk.MODE_K_SCALED | tk.MODE_V_SCALED | tk.MODE_HW | tk.MODE_SAT | tk.MODE_WIDE | tk.MODE_PDL
                   | tk.MODE_FP8_INT | tk.MODE_POW2 | tk.MODE_PACKED)
    assert all(ak.chain_mode(n) & writer_bits == 0 for n in range(8))
    assert ak.chain_mode(5) >> ak.CHAIN_SHIFT == 5
    with pytest.raises(ValueError):
        ak.chain_mode(8)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 6, 7])
def test_gpu_dependent_ops_leave_the_copy_unchanged(n):
    if tk.triton is None or tk.interpreted():
        pytest.skip("needs TRITON_INTERPRET=0")
    g = torch.Generator().manual_seed(n)
    tokens, heads, dim = 8, 8, 128
    k = torch.randn(tokens, heads, dim, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(tokens, heads, dim, generator=g).to(torch.bfloat16).cuda()
    loc = (torch.randperm(255, generator=g)[:tokens] + 1).cuda()
    k_buf = torch.zeros(256, heads, dim, dtype=torch.bfloat16, device="cuda")
    v_buf = torch.zeros_like(k_buf)
    bf16 = KINDS[torch.bfloat16]
    mode = ak.mode_bits(bf16, bf16, False, False, True, False, False, True) | ak.chain_mode(n)
    rk = heads * dim
    ak.store_kv_ablation_kernel[(tokens, 1)](k_buf, v_buf, loc, k, v, 1.0, 1.0, tokens, 256, rk, rk, RK=rk, RV=rk,
                                             BLOCK_K=rk, BLOCK_V=rk, BLOCK_T=1, SPLIT=1, MODE=mode, num_warps=4,
                                             launch_pdl=True)
    assert torch.equal(k_buf[loc].view(torch.int16), k.view(torch.int16))
    assert torch.equal(v_buf[loc].view(torch.int16), v.view(torch.int16))
