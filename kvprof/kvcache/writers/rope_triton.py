"""kvprof's rope writers in Triton: the fused one-launch write and the unfused baselines.

* ``rope_triton_fused`` (:class:`RopeTritonFusedWriter`): one launch rotates q and k in
  place, stores the rotated k and v at ``loc`` and quantises fp8 caches with per-tensor
  scales, like SGLang's ``apply_rope_inplace_with_kvcache`` (which has no fp8 scaling).
* ``rope_then_two_stream``, ``rope_then_triton_fused`` and ``rope_then_store`` (any
  registered store writer, ``store=NAME``) (:class:`RopeThenStoreWriter`): what an engine
  without that fusion runs -- one rotary kernel for q and k (SGLang: ``apply_rope_inplace``,
  its JIT rotary kernel), then its ordinary ``set_kv_buffer`` store. The rotary kernel here
  is kvprof's own (the same Triton kernel with the store compiled out), so the pair differs
  from the fused write only by the fusion; how it compares with SGLang's rotary kernel is
  for a GPU to measure.

The kernel is :mod:`kvprof.kvcache.writers.rope_triton_kernel`, its launch shapes
:mod:`kvprof.kvcache.writers.rope_tables`. On a GPU (sm_90+) both launch with programmatic dependent
launch by default (``pdl=None``), as ``triton_fused`` does; on CPU the kernel runs under
Triton's interpreter (``TRITON_INTERPRET=1`` before this module is imported).
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.core.errors import UsageError
from kvprof.core.vocab import ROPE_FUSED
from kvprof.kvcache import signature
from kvprof.kvcache.contracts import ROPE_INPUTS, KVWriter, RopeKVWriter, WriterInfo, checked_impl
from kvprof.kvcache.signature import keep
from kvprof.kvcache.validation import check_buffers_inputs
from kvprof.kvcache.writers import rope_triton_kernel as kernel
from kvprof.kvcache.writers.card_tables import device_card
from kvprof.kvcache.writers.fp8_jit import hw_cast_safe, placement_reason, uses_pdl
from kvprof.kvcache.writers.rope_tables import (
    RopeConfig,
    RopeTable,
    interpreted_rope_config,
    pick_rope_config,
    rope_table,
)
from kvprof.kvcache.writers.triton_convert import (
    FP8_DTYPES,
    INSTALL_HINT,
    INT32_MAX,
    KINDS,
    e4m3_saturates,
    next_pow2,
    scaled_launch,
    triton,
    triton_missing,
)
from kvprof.kvcache.writers.triton_launch import launcher_for

_SMS: dict[torch.device, int] = {}


def _sm_count(device: torch.device) -> int:
    """The device's SMs (kept per device: a property read is a driver call); 2 on the host, where
    the interpreter runs a persistent grid as a loop all the same."""
    sms = _SMS.get(device)
    if sms is None:
        sms = _SMS[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                              if device.type == "cuda" else 2)
    return sms


class TritonRope:
    """Plans and launches :func:`rope_kv_kernel`: with the store (``launch(..., store=True)``)
    or rotating only (``rotate``). Everything that depends only on shapes and dtypes is
    computed once per combination."""

    def __init__(self, name: str, config: RopeConfig | dict[str, Any] | None = None, convert: str = "auto",
                 pdl: bool | None = None, table: RopeTable | None = None) -> None:
        """``config`` forces one launch shape (tuning), ``table`` replaces the launch table;
        ``convert``: 'auto', 'hw' or 'int' (the integer emulation of torch's rounding on a
        GPU too); ``pdl``: programmatic dependent launch, None = where it exists (compiled,
        sm_90+)."""
        if isinstance(config, dict):
            config = RopeConfig(**config)
        if convert not in ("auto", "hw", "int"):
            raise ValueError(f"convert must be 'auto', 'hw' or 'int', got {convert!r}")
        self.name = name
        self.config = config
        self.table = table
        self.convert = convert
        self.pdl = pdl
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._calls: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # a call's shapes, strides, dtypes -> its launch
        # the tensors' C++ signature and the other arguments -> (the call's launch, its tail, kept launches)
        self._signed: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[Any, ...], dict[Any, Any]]] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """PDL where the compiled kernel runs on sm_90+ (``pdl=None``), or as forced."""
        return triton is not None and uses_pdl(self.pdl, device, compiled=not kernel.interpreted())

    def unsupported_reason(self, device: torch.device, dtype: torch.dtype | None,
                           input_dtype: torch.dtype | None = None) -> str | None:
        if triton is None:
            return triton_missing()
        placement = placement_reason(self.name, kernel.__name__, kernel.interpreted(), device, self.pdl)
        if placement:
            return placement
        if dtype is not None and dtype not in KINDS:
            return f"{self.name} has no conversion to {dtype}"
        if input_dtype is not None and input_dtype not in ROPE_INPUTS:
            return f"{self.name} rotates bf16, fp16 or fp32 q/k, not {input_dtype}"
        return None

    def _plan(self, key: tuple[Any, ...], q: torch.Tensor, k: torch.Tensor, heads_k: int, dim: int, v_dim: int,
              rows: int, rope_dim: int, is_neox: bool, dtype: torch.dtype | None, store: bool) -> tuple[Any, ...]:
        if q.dtype not in ROPE_INPUTS or k.dtype not in ROPE_INPUTS:
            raise ValueError(f"{self.name} rotates bf16, fp16 or fp32 q/k, got {q.dtype} and {k.dtype}")
        if store and dtype not in KINDS:
            raise ValueError(f"{self.name} has no conversion from {k.dtype} to {dtype}")
        if rope_dim % 2 or not 2 <= rope_dim <= dim:
            raise ValueError(f"{self.name}: rope_dim {rope_dim} must be even and in [2, head_dim={dim}]")
        interpreted = kernel.interpreted()
        compiled = k.is_cuda and not interpreted
        hw = {"hw": True, "int": False}.get(self.convert, compiled)
        pdl = self.pdl
        if pdl is None:
            pdl = compiled and torch.cuda.get_device_capability(k.device)[0] >= 9
        out_kind = KINDS[dtype] if store and dtype is not None else KINDS[k.dtype]
        mode = kernel.mode_bits(KINDS[q.dtype], KINDS[k.dtype], out_kind, hw=hw, sat=e4m3_saturates(),
                                neox=is_neox, store=store, pdl=bool(pdl))
        same = not store or dtype == k.dtype
        half = rope_dim // 2
        block_half = next_pow2(half)
        block_p = next_pow2(dim - rope_dim) if dim > rope_dim else 0
        block_dv = next_pow2(v_dim)
        fp8_out = store and dtype in FP8_DTYPES
        # The fp8 hardware cast only where every tile has the layout known to compile right
        # (fp8_jit.hw_cast_safe, per launch shape), else the exact integer encode. GPT-J's k
        # comes out of a join of (even, odd) values, i.e. in pairs per thread: always integer.
        cols = (block_half if is_neox else 2 * block_half, block_p, block_dv)
        widths = (half if is_neox else rope_dim, dim - rope_dim, v_dim)
        fp8_tiles_aligned = is_neox and dim % 16 == 0 and v_dim % 16 == 0 and all(w % 16 == 0 for w in widths)
        pow2_ok = not same and k.dtype in (torch.bfloat16, torch.float32) and fp8_out
        # the launch table of this card's row (kvprof.kvcache.writers.card_tables), or its fallback
        table = self.table or (rope_table(device_card(k.device)[0]) if compiled else None)
        plan = (mode, same, half, block_half, block_p, block_dv, hw and fp8_out, fp8_tiles_aligned, cols, widths,
                pow2_ok, bool(pdl), interpreted, table)
        self._plans[key] = plan
        return plan

    def launch_shape(self, tokens: int, heads: int, dim: int, head_elements: int, interpreted: bool,
                     table: RopeTable | None = None) -> RopeConfig:
        """The forced shape, the interpreter's (few large programs), or the table's (``table``:
        the card's, default the writer's own or the fallback)."""
        if self.config is not None:
            return self.config
        if interpreted:
            return interpreted_rope_config(heads, head_elements, tokens)
        return pick_rope_config(dim, tokens, table or self.table)

    def _launch_plan(self, tokens: int, heads_q: int, heads_k: int, dim: int,
                     plan: tuple[Any, ...], sms: int = 1) -> tuple[Any, ...]:
        """The launch shape of ``tokens`` under ``plan``, its grid and the mode bits it needs (the
        fp8 encode, the programs' order, the streaming hints); ``sms``: the device's SMs, for a
        persistent shape's grid."""
        (_, _, _, block_half, block_p, block_dv, fp8_hw, fp8_tiles_aligned, cols, widths, _, _, interpreted,
         table) = plan
        cfg = self.launch_shape(tokens, max(heads_q, heads_k), dim, max(2 * block_half + block_p, block_dv),
                                interpreted, table)
        block_t, num_warps = cfg.block_t, cfg.num_warps
        block_hq, block_hk = min(cfg.block_h, next_pow2(heads_q)), min(cfg.block_h, next_pow2(heads_k))
        shape_mode = 0
        if fp8_hw and not (fp8_tiles_aligned and all(hw_cast_safe(c, 16, block_t * block_hk * c, num_warps)
                                                     for c, w in zip(cols, widths) if w)):
            shape_mode = kernel.MODE_FP8_INT
        blocks, groups = -(-tokens // block_t), -(-heads_q // block_hq) + -(-heads_k // block_hk)
        if cfg.stream:
            shape_mode |= kernel.MODE_STREAM
        if cfg.persistent:
            programs = min(blocks * groups, cfg.persistent * sms)
            return block_t, num_warps, block_hq, block_hk, (programs,), shape_mode | kernel.MODE_PERSISTENT
        if cfg.token_major:
            return block_t, num_warps, block_hq, block_hk, (blocks * groups,), shape_mode | kernel.MODE_TOKEN_MAJOR
        return block_t, num_warps, block_hq, block_hk, (blocks, groups), shape_mode

    def launch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, k_buf: torch.Tensor | None,
               v_buf: torch.Tensor | None, loc: torch.Tensor | None, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor, is_neox: bool, dtype: torch.dtype | None,
               k_scale: float | torch.Tensor | None = None, v_scale: float | torch.Tensor | None = None,
               store: bool = True) -> None:
        """Rotate q and k in place and, with ``store``, write the rotated k and v at ``loc``.

        Everything but the tensors' addresses and the scales follows from the call's shapes,
        strides, dtypes and device: one key of those finds the launch's grid, integer arguments
        and constexprs (:meth:`_call_plan`, once per key), so an eager write reads each
        attribute once and computes nothing else. Where the launcher's C++ signature helper is
        built, the key is the signature of the eight tensors (one call) and the launch the
        kept kernel's (:class:`triton_launch.SignedLaunch`); the attributes are read only the
        first time. The rotary alone signs q, k, positions and the table (its other pointers
        repeat k and positions: placeholders the kernel compiles out)."""
        signed = None
        if signature.SIGNATURE is not None:
            signed = (signature.SIGNATURE(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache) if store else
                      signature.SIGNATURE(q, k, positions, cos_sin_cache))
            if signed is not None and self._launch_kept(signed, dtype, is_neox, k_scale, v_scale, store):
                return
        tokens = positions.shape[0]
        if tokens == 0:
            return
        call_key: tuple[Any, ...]
        if store:
            assert k_buf is not None and v_buf is not None and v is not None and loc is not None
            if not (k_buf.is_contiguous() and v_buf.is_contiguous()):
                raise ValueError(f"{self.name} needs contiguous K/V cache buffers")
            call_key = (tokens, q.shape, k.shape, q.stride(), k.stride(), v.shape, v.stride(), v_buf.shape,
                        k_buf.shape[0], loc.stride(0), positions.stride(0), cos_sin_cache.shape,
                        cos_sin_cache.stride(0), q.dtype, k.dtype, dtype, is_neox, k.get_device(),
                        k_scale is None, v_scale is None)
        else:
            call_key = (tokens, q.shape, k.shape, q.stride(), k.stride(), None, None, None, 0, 0,
                        positions.stride(0), cos_sin_cache.shape, cos_sin_cache.stride(0), q.dtype, k.dtype,
                        None, is_neox, k.get_device(), True, True)
        call = self._calls.get(call_key)
        if call is None:
            call = self._call_plan(call_key, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,
                                   k_scale is not None, v_scale is not None, store)
        grid, fixed, consts, pow2_consts, copy_v, scaled, num_warps, pdl = call
        k_inv = v_inv = 1.0
        if scaled:
            k_inv, v_inv, consts = scaled_launch(k_scale, v_scale, consts, pow2_consts)
        if store:
            if copy_v:
                v = v.contiguous()  # type: ignore[union-attr]  # read only: a copy changes nothing the caller sees
            args = (q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, k_inv, v_inv, tokens)
        else:  # placeholders: STORE=0 compiles them out
            args = (q, k, k, k, k, positions, positions, cos_sin_cache, k_inv, v_inv, tokens)
        # the rows, the table's rows and the strides: fixed for a model, keyed by value
        launcher = launcher_for(kernel.rope_kv_kernel, kernel.KERNEL_NAME)
        if signed is None or copy_v:  # v copied: the kernel gets another tensor than the one signed
            launcher.launch(grid, args, consts, num_warps, pdl, False, fixed)
            return
        launch = launcher.launch_signed(grid, args, consts, num_warps, pdl, False, fixed, kernel.rope_kv_kernel)
        # kept under the call's signature and these constexprs (the plan's, or its power-of-two variant)
        key = (signed[0], dtype, is_neox, k_scale is None, v_scale is None)
        hit = self._signed.get(key) or keep(self._signed, key, (call, (tokens, *fixed), {}))
        if launch is not None:
            hit[2][consts] = launch

    def _launch_kept(self, signed: tuple[bytes, tuple[int, ...]], dtype: torch.dtype | None, is_neox: bool,
                     k_scale: float | torch.Tensor | None, v_scale: float | torch.Tensor | None, store: bool) -> bool:
        """Launch a call whose plan and kernel are kept under its signature; whether it did."""
        hit = self._signed.get((signed[0], dtype, is_neox, k_scale is None, v_scale is None))
        if hit is None:
            return False
        planned, tail, kept = hit
        consts = planned[2]
        k_inv = v_inv = 1.0
        if planned[5]:
            k_inv, v_inv, consts = scaled_launch(k_scale, v_scale, consts, planned[3])
        launch = kept.get(consts)
        ptrs = signed[1]
        if not store:  # q, k, positions, the table: as the kernel takes them, k and positions repeated
            ptrs = (ptrs[0], ptrs[1], ptrs[1], ptrs[1], ptrs[1], ptrs[2], ptrs[2], ptrs[3])
        return launch is not None and bool(launch(kernel.rope_kv_kernel, (*ptrs, k_inv, v_inv, *tail, *consts)))

    def _call_plan(self, call_key: tuple[Any, ...], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
                   k_buf: torch.Tensor | None, v_buf: torch.Tensor | None, loc: torch.Tensor | None,
                   positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool, dtype: torch.dtype | None,
                   k_scaled: bool, v_scaled: bool, store: bool) -> tuple[Any, ...]:
        """What :meth:`launch` needs of a call keyed by ``call_key``: the grid, the integer
        arguments after ``tokens``, the constexprs (with the fp8 power-of-two bit where the scales allow it),
        whether v is copied to unit stride, whether the scales apply, warps and PDL."""
        tokens = positions.shape[0]
        heads_q = q.shape[1]
        _, heads_k, dim = k.shape
        if store:
            assert k_buf is not None and v_buf is not None and v is not None
            v_dim, rows = v_buf.shape[2], k_buf.shape[0]
        else:
            v_dim, rows = dim, 0
        cs_rows, rope_dim = cos_sin_cache.shape
        key = (q.dtype, k.dtype, dtype, heads_q, heads_k, dim, v_dim, rows, rope_dim, is_neox, store, k.device)
        plan = self._plans.get(key) or self._plan(key, q, k, heads_k, dim, v_dim, rows, rope_dim, is_neox,
                                                  dtype, store)
        (mode, same, half, block_half, block_p, block_dv, _, _, _, _, pow2_ok, pdl, _, _) = plan
        copy_v = False
        v_st = v_sh = loc_st = 0
        scaled = False
        if store:
            assert v is not None and loc is not None
            v_strides = v.stride()
            copy_v = v_strides[2] != 1
            if copy_v:
                v_strides = v.contiguous().stride()
            v_st, v_sh = v_strides[0], v_strides[1]
            loc_st = loc.stride(0)
            scaled = not same and (k_scaled or v_scaled)
            if scaled:
                mode |= (kernel.MODE_K_SCALED if k_scaled else 0) | (kernel.MODE_V_SCALED if v_scaled else 0)
        block_t, num_warps, block_hq, block_hk, grid, shape_mode = self._launch_plan(
            tokens, heads_q, heads_k, dim, plan, _sm_count(k.device))
        mode |= shape_mode
        q_st, q_sh = q.stride()[:2]
        k_st, k_sh = k.stride()[:2]
        reach = (tokens + block_t) * max(abs(q_st), abs(k_st), abs(v_st), 1)
        if rows * heads_k * max(dim, v_dim) > INT32_MAX or reach > INT32_MAX or cos_sin_cache.numel() > INT32_MAX:
            mode |= kernel.MODE_WIDE
        fixed = (rows, cs_rows, q_st, q_sh, k_st, k_sh, v_st, v_sh, loc_st, positions.stride(0),
                 cos_sin_cache.stride(0))
        consts = (heads_q, heads_k, dim, v_dim, half, block_half, block_p, block_dv, block_t, block_hq, block_hk,
                  mode)
        pow2_consts = consts[:-1] + (mode | kernel.MODE_POW2,) if scaled and pow2_ok else None
        return keep(self._calls, call_key, (grid, fixed, consts, pow2_consts, copy_v, scaled, num_warps, pdl))

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
               is_neox: bool) -> None:
        """The rotary embedding alone: q and k rotated in place, one launch."""
        self.launch(q, k, None, None, None, None, positions, cos_sin_cache, is_neox, None, store=False)


class RopeTritonFusedWriter(RopeKVWriter):
    """One Triton launch: rope on q and k in place, the rotated k and v stored at ``loc``."""

    name = "rope_triton_fused"
    kernel_name = kernel.KERNEL_NAME
    description = "kvprof's Triton rope + K/V store: one launch rotates q and k, stores k and v (fp8 in-kernel)"
    fused = True
    rope_fused = True
    devices = ("cpu", "cuda")

    def __init__(self, config: RopeConfig | dict[str, Any] | None = None, convert: str = "auto",
                 pdl: bool | None = None) -> None:
        """Options as :class:`TritonRope`: ``config`` (one launch shape), ``convert``, ``pdl``."""
        self.kernel = TritonRope(self.name, config, convert, pdl)

    def launches_pdl(self, device: torch.device) -> bool:
        return self.kernel.launches_pdl(device)

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        return (super().unsupported_reason(device, dtype, input_dtype)
                or self.kernel.unsupported_reason(device, dtype, input_dtype))

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None) -> str:
        self.kernel.launch(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype, k_scale, v_scale)
        return ROPE_FUSED

    def info(self) -> WriterInfo:
        info = super().info()
        if triton is not None and kernel.interpreted():
            info.extra["interpreted"] = "Triton's interpreter on the host"
        return info


class RopeThenStoreWriter(RopeKVWriter):
    """The unfused baseline: kvprof's Triton rotary kernel (one launch for q and k), then a
    registered store writer's ``write`` -- two kernels or more, as an engine runs rope and
    ``set_kv_buffer`` without the fusion. The path is the store's (FUSED, TWO_STREAMS...).
    ``rope_then_store`` takes the store by name (``store=NAME``, default index_put);
    ``rope_then_two_stream`` and ``rope_then_triton_fused`` are the two stores a fused write
    is held against (SGLang's unfused store, and kvprof's fused store alone)."""

    name = "rope_then_store"
    rope_fused = False
    rope_kernels = 1  # launches before the store's own: the rotary kernel

    def __init__(self, store: str = "index_put", rope_config: RopeConfig | dict[str, Any] | None = None,
                 rope_pdl: bool | None = None, **store_options: Any) -> None:
        """``store``: a registered MHA store writer, built with the remaining keywords;
        ``rope_config``/``rope_pdl``: the rotary kernel's launch shape and PDL (None: where it
        exists, as the store writers' own default). The store is built by the one registry
        (kvprof's writers are in it: this module's package registered them when it was imported)."""
        from kvprof.kvcache.registry import create_writer

        built = create_writer(store, **store_options)
        if not isinstance(built, KVWriter):
            raise UsageError(f"{self.name}: {store!r} is not a store writer of the MHA layout")
        self.store: KVWriter = built
        self.description = f"kvprof's Triton rotary kernel for q and k, then the {self.store.name} store"
        self.fused = self.store.fused
        self.devices = tuple(d for d in self.store.devices if d in ("cpu", "cuda"))
        self.rotary = TritonRope(self.name, rope_config, "auto", rope_pdl)

    def launches_pdl(self, device: torch.device) -> bool:
        """The write's first kernel is the rotary (``rope_pdl``); the store's PDL is the store's."""
        return self.rotary.launches_pdl(device)

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        return (super().unsupported_reason(device, dtype, input_dtype)
                or self.rotary.unsupported_reason(device, None, input_dtype)
                or self.store.unsupported_reason(device, dtype, input_dtype))

    def prepare(self, device: torch.device) -> None:
        self.store.prepare(device)

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None) -> str:
        self.rotary.rotate(q, k, positions, cos_sin_cache, is_neox)
        # the store's inputs, as the pool passes them
        loc, cache_k, cache_v = check_buffers_inputs(k_buf, v_buf, loc, k, v)
        return checked_impl(self.store)(k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale)

    def info(self) -> WriterInfo:
        info = super().info()
        info.extra["store"] = self.store.name
        store = self.store.info().extra
        info.extra.update({f"store_{key}": value for key, value in store.items()})
        # the rotary is kvprof's Triton kernel: in Triton's interpreter, so is the write's time
        if triton is not None and kernel.interpreted():
            info.extra["interpreted"] = "Triton's interpreter on the host (the rotary kernel)"
        elif store.get("interpreted"):
            info.extra["interpreted"] = store["interpreted"]
        return info


class RopeThenTwoStreamWriter(RopeThenStoreWriter):
    """Rotary kernel, then SGLang's unfused store (two copies, two streams under a CUDA graph)."""

    name = "rope_then_two_stream"

    def __init__(self, rope_config: RopeConfig | dict[str, Any] | None = None, rope_pdl: bool | None = None,
                 **store_options: Any) -> None:
        super().__init__("two_stream", rope_config, rope_pdl, **store_options)


class RopeThenTritonFusedWriter(RopeThenStoreWriter):
    """Rotary kernel, then kvprof's fused Triton store: the fused rope write minus the fusion."""

    name = "rope_then_triton_fused"

    def __init__(self, rope_config: RopeConfig | dict[str, Any] | None = None, rope_pdl: bool | None = None,
                 **store_options: Any) -> None:
        super().__init__("triton_fused", rope_config, rope_pdl, **store_options)


__all__ = ["INSTALL_HINT", "RopeThenStoreWriter", "RopeThenTritonFusedWriter", "RopeThenTwoStreamWriter",
           "RopeTritonFusedWriter", "TritonRope"]
