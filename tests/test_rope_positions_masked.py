"""A position outside the cos/sin table, where nothing on the host checks it (a GPU with slot
checks off: reading positions there is a device sync), is never read past the table by the
Triton rope kernel: that token is not rotated (and, where the kernel also stores, not stored, as
rope_cuda_fused skips it), and every other token is written as the reference writes it. Run here
in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from kvprof.kvcache.writers import create_writer  # noqa: E402
from kvprof.kvcache.writers.rope_reference import rope_reference  # noqa: E402

TOKENS, HQ, HK, D, MAX_POS, ROWS = 6, 4, 2, 16, 32, 16


@pytest.mark.parametrize("name", ["rope_triton_fused", "rope_then_triton_fused"])
@pytest.mark.parametrize("bad", [MAX_POS, MAX_POS + 7, 1 << 40, -1])
def test_a_position_past_the_table_is_skipped_not_read(name: str, bad: int) -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(TOKENS, HQ, D, generator=gen).to(torch.bfloat16)
    k = torch.randn(TOKENS, HK, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(TOKENS, HK, D, generator=gen).to(torch.bfloat16)
    cos_sin = torch.randn(MAX_POS, D, generator=gen)
    positions = torch.tensor([0, 5, bad, 31, 2, 9])
    loc = torch.tensor([1, 3, 4, 7, 9, 15])
    k_buf = torch.zeros(ROWS, HK, D, dtype=torch.bfloat16)
    v_buf = torch.zeros(ROWS, HK, D, dtype=torch.bfloat16)
    q0, k0 = q.clone(), k.clone()
    w = create_writer(name)
    w.prepare(torch.device("cpu"))
    # the kernel's own path: what a GPU caller with slot checks off reaches (on a CPU the
    # writer's checks refuse this call before the kernel, tests/test_writer_contracts.py)
    w.write_unchecked(q, k, v, k_buf, v_buf, loc, positions, cos_sin, True, torch.bfloat16)
    good = torch.tensor([i for i in range(TOKENS) if i != 2])
    q_ref, k_ref = rope_reference(q0[good], k0[good], cos_sin, positions[good], True)
    torch.testing.assert_close(q[good].float(), q_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k_buf[loc[good]].float(), k_ref, atol=2e-2, rtol=2e-2)
    assert torch.equal(v_buf[loc[good]], v[good])
    assert torch.equal(q[2], q0[2]) and torch.equal(k[2], k0[2]), "the skipped token was rotated"
    if name == "rope_triton_fused":  # one launch: the skipped token is not stored either
        assert not k_buf[loc[2]].any() and not v_buf[loc[2]].any(), "the skipped token was stored"
    else:  # the rotary kernel skips it; the store after it writes the token's (unrotated) k as given
        assert torch.equal(k_buf[loc[2]], k0[2]) and torch.equal(v_buf[loc[2]], v[2])
