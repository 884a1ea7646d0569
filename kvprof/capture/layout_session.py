"""A capture session for the MLA and paged layouts: the MHA session's workload (phases,
steps, warm-up, CUDA graphs, ranges) with the layout's pool, slots and inputs.

MLA writes go through ``set_mla_kv_buffer`` with nope and rope as views of one latent
tensor (as SGLang's DeepSeek model hands them over); slots come from the MHA allocator
(slot 0, the dummy, is never handed out). Paged writes go through ``reshape_and_cache_flash``
with slots from fragmented block tables (``kvprof.kvcache.layouts.workload``); decode batches are
padded with -1 to vLLM's CUDA-graph batch sizes, so a write's token count (the range's
payload) includes its padding tokens, as the kernel's does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from kvprof.capture.plan import CapturePlan
from kvprof.capture.rope_session import RopeSession
from kvprof.capture.session import MHASession, PreparedPhase, VariantSession
from kvprof.core.errors import Setting, UsageError
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.instrument import make_layout_pool
from kvprof.kvcache.layer import DecoderContext
from kvprof.kvcache.layouts.layout import PoolT, get_layout
from kvprof.kvcache.layouts.mla import MLA_PRESETS
from kvprof.kvcache.layouts.workload import BlockTables, graph_size
from kvprof.kvcache.mla_pool import MLAPool
from kvprof.kvcache.paged_pool import PagedPool
from kvprof.kvcache.workload import PhaseSpec, SlotAllocator, default_pool_size

PAGED_BLOCK_SIZE = 16  # vLLM's default block size, used unless --page-size says otherwise


class LayoutSession(VariantSession[PoolT]):
    """``VariantSession`` for a layout other than MHA: writes only, no decoder context."""

    def __init__(self, plan: CapturePlan, writer: Writer, device: torch.device, *, instrument: bool = True,
                 context: DecoderContext | None = None) -> None:
        if context is not None:
            raise UsageError(Setting("context"), " layer models MHA decoder layers; the mla and paged layouts capture "
                             "writes only")
        super().__init__(plan, writer, device, instrument=instrument)

    def _element_size(self) -> int:
        return torch.empty((), dtype=self.cache_dtype).element_size()


class MLASession(LayoutSession[MLAPool]):
    """SGLang's MLA pool written through ``set_mla_kv_buffer``, slots from the MHA allocator."""

    def make_pool(self, instrument: bool) -> MLAPool:
        plan, device = self.plan, self.device
        mla = MLA_PRESETS[plan.model.strip().lower()]
        size = plan.pool_size or default_pool_size(self.phases, 1, mla.kv_lora_rank + mla.qk_rope_head_dim,
                                                     mla.layers, self._element_size(), device)
        pool: MLAPool = make_layout_pool(self.layout.name,
            size, plan.page_size, self.cache_dtype, mla.kv_lora_rank, mla.qk_rope_head_dim,
            plan.layers, device, writer=self.writer, check_slots=False, instrument=instrument,
            variant=self.writer.name)
        self.allocator = SlotAllocator(pool.rows, plan.slots, plan.page_size, plan.seed)
        return pool

    def prepare(self, spec: PhaseSpec, index: int) -> PreparedPhase:
        slots = self.allocator.steps(spec)
        locs = torch.from_numpy(slots).to(device=self.device, dtype=self.plan.loc_dtype)
        gen = torch.Generator(device="cpu").manual_seed(self.plan.seed + index)
        latent = torch.randn((slots.shape[1], 1, self.pool.kv_cache_dim), generator=gen).to(
            dtype=self.input_dtype, device=self.device)
        # nope and rope as views of one latent tensor, as SGLang's DeepSeek model hands them over
        k, v = latent[..., : self.pool.kv_lora_rank], latent[..., self.pool.kv_lora_rank:]
        return PreparedPhase(spec, locs, k, v)

    def close(self) -> None:
        self.pool.kv_buffer.clear()
        super().close()


class PagedSession(LayoutSession[PagedPool]):
    """vLLM's paged cache written through ``reshape_and_cache_flash``, slots off block tables."""

    def make_pool(self, instrument: bool) -> PagedPool:
        plan, device = self.plan, self.device
        decode_pad = max((graph_size(p.tokens) for p in self.phases if p.phase == "decode"), default=1)
        largest = max([p.tokens for p in self.phases] + [decode_pad])
        self.block_size = plan.page_size if plan.page_size > 1 else PAGED_BLOCK_SIZE
        slots = plan.pool_size or default_pool_size(self.phases, self.shape.head_num, 2 * self.shape.head_dim,
                                                      self.shape.layers, self._element_size(), device)
        # room for the largest write's blocks, each request's last block part-filled
        blocks = max(-(-slots // self.block_size), 2 * (-(-largest // self.block_size)) + decode_pad + 8)
        pool: PagedPool = make_layout_pool(self.layout.name,
            blocks, self.block_size, self.cache_dtype, self.shape.head_num, self.shape.head_dim,
            plan.layers, device, writer=self.writer, check_slots=False, instrument=instrument,
            variant=self.writer.name)
        self.tables = BlockTables(blocks, self.block_size, plan.seed)
        return pool

    def _slots(self, spec: PhaseSpec) -> np.ndarray:
        """[steps, tokens (+ padding)] slots off fragmented block tables, checked here."""
        blocks = self.pool.num_blocks
        if spec.phase == "decode":
            # contexts that leave every request room in the cache
            room = (blocks // max(spec.tokens, 1) - 2) * self.block_size
            ctx = max(0, min(self.plan.context_len, room))
            out = np.stack([self.tables.decode(spec.tokens, ctx) for _ in range(spec.steps)])
        else:
            chunk = min(spec.tokens, 2048)
            out = np.stack([self.tables.prefill(spec.tokens, chunk) for _ in range(spec.steps)])
        assert out.max() < self.pool.slots and out.min() >= -1
        return out

    def prepare(self, spec: PhaseSpec, index: int) -> PreparedPhase:
        slots = self._slots(spec)
        locs = torch.from_numpy(slots).to(device=self.device, dtype=self.plan.loc_dtype)
        gen = torch.Generator(device="cpu").manual_seed(self.plan.seed + index)
        amplitude = 1.0 if self.k_scale is None else float(self.k_scale)
        shape = (slots.shape[1], self.shape.head_num, self.shape.head_dim)
        k = (torch.randn(shape, generator=gen) * amplitude).to(dtype=self.input_dtype, device=self.device)
        v = (torch.randn(shape, generator=gen) * amplitude).to(dtype=self.input_dtype, device=self.device)
        return PreparedPhase(spec, locs, k, v)

    def close(self) -> None:
        self.pool.key_cache.clear()
        self.pool.value_cache.clear()
        super().close()


# the session of each layout beside MHA's (kvprof.capture.session.MHASession)
LAYOUT_SESSIONS: dict[str, type[LayoutSession[Any]]] = {"mla": MLASession, "paged": PagedSession}


@contextmanager
def session_for(plan: CapturePlan, writer: Writer, device: torch.device,
                **kw: Any) -> Iterator[VariantSession[Any]]:
    """The session for ``plan``'s layout (the MHA pool's, or an MLA or paged one), closed after the block."""
    layout = plan.layout
    session: VariantSession[Any]
    rope = layout == "mha" and get_layout(layout).contract_of(writer) == "rope"
    if rope and kw.get("context") is None:  # rope + store writes alone (in a layer: MHASession)
        session = RopeSession(plan, writer, device, **kw)
    elif layout == "mha":
        session = MHASession(plan, writer, device, **kw)
    else:  # the MLA and paged layouts: their pools, slots and inputs
        session = LAYOUT_SESSIONS[layout](plan, writer, device, **kw)
    try:
        yield session
    finally:
        session.close()
