"""A capture session for the MLA and paged layouts: the MHA session's workload (phases,
steps, warm-up, CUDA graphs, ranges) with the layout's pool, slots and inputs.

MLA writes go through ``set_mla_kv_buffer`` with nope and rope as views of one latent
tensor (as SGLang's DeepSeek model hands them over); slots come from the MHA allocator
(slot 0, the dummy, is never handed out). Paged writes go through ``reshape_and_cache_flash``
with slots from fragmented block tables (``kvprof.layouts.workload``); decode batches are
padded with -1 to vLLM's CUDA-graph batch sizes, so a write's token count (the range's
payload) includes its padding tokens, as the kernel's does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from kvprof.capture.config import CaptureConfig
from kvprof.capture.session import PreparedPhase, VariantSession
from kvprof.core.errors import UsageError
from kvprof.layouts.instrument import make_layout_pool
from kvprof.layouts.registry import MLA_PRESETS
from kvprof.layouts.workload import BlockTables, graph_size
from kvprof.workload import PhaseSpec, SlotAllocator, default_pool_size
from kvprof.writers import KVWriter

PAGED_BLOCK_SIZE = 16  # vLLM's default block size, used unless --page-size says otherwise


class LayoutSession(VariantSession):
    """``VariantSession`` for ``config.layout_name()`` in ("mla", "paged")."""

    # an MLAPool or a PagedPool: not KVPools, they share only the surface VariantSession
    # uses (path_counts, bytes_per_write, start_layer, layer_num); the layout's own members
    # are reached by self.layout
    pool: Any

    def __init__(self, config: CaptureConfig, writer, device: torch.device, *, instrument: bool = True,
                 context=None) -> None:  # noqa: ANN001
        if context is not None:
            raise UsageError("--context layer models MHA decoder layers; the mla and paged layouts capture writes only")
        self.config, self.context, self.mode = config, None, "writes"
        self.writer, self.device = writer, device
        self.layout = config.layout_name()
        self.shape = config.rank_shape()
        self.cache_dtype = config.cache_torch_dtype()
        self.input_dtype = config.input_torch_dtype()
        self.phases = config.phase_specs(graphs_possible=device.type == "cuda")
        elem = torch.empty((), dtype=self.cache_dtype).element_size()
        decode_pad = max((graph_size(p.tokens) for p in self.phases if p.phase == "decode"), default=1)
        largest = max([p.tokens for p in self.phases] + [decode_pad])
        if self.layout == "mla":
            mla = MLA_PRESETS[config.model.strip().lower()]
            size = config.pool_size or default_pool_size(self.phases, 1, mla.kv_lora_rank + mla.qk_rope_head_dim,
                                                         mla.layers, elem, device)
            self.pool = make_layout_pool("mla", size, config.page_size, self.cache_dtype, mla.kv_lora_rank,
                                         mla.qk_rope_head_dim, config.layers_on(device.type), device, writer=writer,
                                         check_slots=False, instrument=instrument, variant=writer.name)
            self.allocator = SlotAllocator(self.pool.rows, config.slots, config.page_size, config.seed)
        else:
            self.block_size = config.page_size if config.page_size > 1 else PAGED_BLOCK_SIZE
            slots = config.pool_size or default_pool_size(self.phases, self.shape.head_num, 2 * self.shape.head_dim,
                                                          self.shape.layers, elem, device)
            # room for the largest write's blocks, each request's last block part-filled
            blocks = max(-(-slots // self.block_size), 2 * (-(-largest // self.block_size)) + decode_pad + 8)
            self.pool = make_layout_pool("paged", blocks, self.block_size, self.cache_dtype, self.shape.head_num,
                                         self.shape.head_dim, config.layers_on(device.type), device, writer=writer,
                                         check_slots=False, instrument=instrument, variant=writer.name)
            self.tables = BlockTables(blocks, self.block_size, config.seed)
        writer.prepare(device)
        self.layers = list(range(self.pool.start_layer, self.pool.start_layer + self.pool.layer_num))
        self.k_scale, self.v_scale = config.k_scale, config.v_scale

    def _paged_slots(self, spec: PhaseSpec) -> np.ndarray:
        """[steps, tokens (+ padding)] slots off fragmented block tables, checked here."""
        blocks = self.pool.num_blocks
        if spec.phase == "decode":
            # contexts that leave every request room in the cache
            ctx = max(0, min(self.config.context_len, (blocks // max(spec.tokens, 1) - 2) * self.block_size))
            out = np.stack([self.tables.decode(spec.tokens, ctx) for _ in range(spec.steps)])
        else:
            chunk = min(spec.tokens, 2048)
            out = np.stack([self.tables.prefill(spec.tokens, chunk) for _ in range(spec.steps)])
        assert out.max() < self.pool.slots and out.min() >= -1
        return out

    def prepare(self, spec: PhaseSpec, index: int) -> PreparedPhase:
        if self.layout == "mla":
            slots = self.allocator.steps(spec)
        else:
            slots = self._paged_slots(spec)
        locs = torch.from_numpy(slots).to(device=self.device, dtype=self.config.torch_loc_dtype())
        gen = torch.Generator(device="cpu").manual_seed(self.config.seed + index)
        n = slots.shape[1]
        if self.layout == "mla":
            width = self.pool.kv_cache_dim
            latent = torch.randn((n, 1, width), generator=gen).to(dtype=self.input_dtype, device=self.device)
            k, v = latent[..., : self.pool.kv_lora_rank], latent[..., self.pool.kv_lora_rank:]
        else:
            amplitude = 1.0 if self.k_scale is None else float(self.k_scale)
            shape = (n, self.shape.head_num, self.shape.head_dim)
            k = (torch.randn(shape, generator=gen) * amplitude).to(dtype=self.input_dtype, device=self.device)
            v = (torch.randn(shape, generator=gen) * amplitude).to(dtype=self.input_dtype, device=self.device)
        return PreparedPhase(spec, locs, k, v)

    def _write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.layout == "mla":
            self.pool.set_mla_kv_buffer(layer, loc, k, v)
        else:
            self.pool.reshape_and_cache_flash(layer, k, v, loc, self.k_scale, self.v_scale)

    def write_step(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for layer in self.layers:
            self._write(layer, loc, k, v)

    def close(self) -> None:
        for name in ("kv_buffer", "key_cache", "value_cache"):
            getattr(self.pool, name, []).clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@contextmanager
def session_for(config: CaptureConfig, writer: KVWriter, device: torch.device, **kw: object) -> Iterator[VariantSession]:
    """The session for ``config``'s layout (the MHA pool's, or an MLA or paged one), closed after the block."""
    if config.layout_name() != "mha":  # the MLA and paged layouts: their pools, slots and inputs
        session: VariantSession = LayoutSession(config, writer, device, **kw)  # type: ignore[arg-type]
    else:
        session = VariantSession(config, writer, device, **kw)  # type: ignore[arg-type]
    try:
        yield session
    finally:
        session.close()
