"""kvprof's rope (+ K/V store) kernel in Triton: one launch rotates q and k in place and,
with ``STORE``, stores the rotated k and v into the cache at ``loc``.

* Grid ``(token blocks, q head groups + k head groups)``: a program rotates ``BLOCK_HQ``
  heads of q for ``BLOCK_T`` tokens, or ``BLOCK_HK`` heads of k -- and then stores them and
  the same heads of v. Positions, slots and cos/sin are loaded once per program and
  broadcast over its heads. With ``TOKEN_MAJOR`` the grid is one axis of
  ``token blocks x groups``, groups fastest: the programs a GPU runs side by side cover
  whole qkv rows of neighbouring tokens, and the heavier k + v programs are spread among
  the q programs instead of all running in the last wave.
* With ``PERSISTENT`` a fixed grid (a few programs per SM) walks those token-major tiles,
  each program every grid-th tile (:func:`_rope_tile` is one tile); ``STREAM`` loads q, k
  and v evict-first and stores the cache rows streaming (``.cs``). Both are launch-shape
  choices of :class:`~kvprof.kvcache.writers.rope_tables.RopeConfig`, for the tables to take
  where a card measures them faster.
* The rotation runs in fp32 and rounds once to the input dtype (what is written back to q
  and k). The writers launch it with fp fusion off, so a GPU computes each product and sum
  as the float32 reference does (no FMA contraction; two more instructions per pair in a
  kernel bound by memory) and the rotated values are the reference's, bitwise. The K cache
  gets those rounded values, converted to the cache dtype exactly as
  :func:`kvprof.kvcache.dtypes.convert_for_cache` converts (:func:`triton_kernel.convert_bits`:
  fp8 with per-tensor scales in the same launch).
* GPT-NeoX loads the two halves of the rotated dims as two contiguous vectors; GPT-J loads
  the rotated dims once and splits them into even and odd elements in registers.
* ``loc`` and ``positions`` are read with their own strides (any 1-D view), and the slot is
  masked to ``[0, rows)``: a row outside the cache is never written.
* ``STORE`` = 0 compiles the store out: the rotary-only kernel the unfused variants run
  before their store writer.
* On the hardware conversion path the fp32 -> storage rounding is ``cvt.rn``; under Triton's
  interpreter (CPU), whose float casts do not round to nearest even, it is the integer
  emulation of torch's rounding (:mod:`kvprof.kvcache.writers.triton_convert`).
"""

from __future__ import annotations

from kvprof.kvcache.devinfo import decorates_triton_kernels
from kvprof.kvcache.writers.triton_convert import triton

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

if triton is not None:
    import triton.language as tl

    from kvprof.kvcache.writers.triton_convert import (
        F32,
        as_bits,
        hw_narrow,
        hw_widen,
        int_narrow,
        int_widen,
        to_storage,
    )
    from kvprof.kvcache.writers.triton_kernel import convert_bits

# The kernel's name in every trace (the Triton function's own). The same kernel rotates alone
# (STORE off) for the unfused variants, so the name alone does not say "write"; the SGLang plugin
# records it with each rope + store write it routes to kvprof (only where SGLang's rotary writes
# the cache), and a replayed graph with more kernels of this name than recorded writes is left
# unattributed with a warning (kvprof.trace.plugin_graphs).
KERNEL_NAME = "rope_kv_kernel"

# MODE bits: q kind (0-2), k/v kind (3-5), cache kind (6-8), then one flag each
MODE_K_SCALED = 1 << 9
MODE_V_SCALED = 1 << 10
MODE_HW = 1 << 11  # hardware conversions (else the integer emulation)
MODE_SAT = 1 << 12  # torch saturates e4m3fn overflow (>= 2.12)
MODE_WIDE = 1 << 13  # 64-bit offsets
MODE_PDL = 1 << 14  # programmatic dependent launch
MODE_FP8_INT = 1 << 15  # fp8 through the integer routines (see triton_kernel.fp8_cast_safe)
MODE_POW2 = 1 << 16  # the inverse scales are powers of two (triton_convert.pow2_exact)
MODE_NEOX = 1 << 17  # GPT-NeoX halves, else GPT-J pairs
MODE_STORE = 1 << 18  # store k and v into the cache (else rotate only)
MODE_TOKEN_MAJOR = 1 << 19  # a 1-D grid, head groups fastest (else (token blocks, head groups))
MODE_STREAM = 1 << 20  # inputs loaded evict-first, cache rows stored streaming (.cs)
MODE_PERSISTENT = 1 << 21  # a fixed grid of programs walks the token-major tiles


def mode_bits(q_kind: int, in_kind: int, out_kind: int, *, hw: bool, sat: bool, neox: bool, store: bool,
              pdl: bool) -> int:
    """The kernel's packed compile-time flags; SCALED, WIDE, FP8_INT and POW2 are set per call."""
    return (q_kind | in_kind << 3 | out_kind << 6 | hw * MODE_HW | sat * MODE_SAT | neox * MODE_NEOX
            | store * MODE_STORE | pdl * MODE_PDL)


def interpreted() -> bool:
    """Whether the kernel was decorated under TRITON_INTERPRET (it then runs on the host)."""
    from kvprof.kvcache.writers.fp8_jit import interpreted as _interpreted

    return triton is not None and _interpreted(rope_kv_kernel)


if triton is not None:

    @triton.jit
    def _widen(raw, KIND: tl.constexpr, HW: tl.constexpr):
        """Storage bits of KIND (loaded values reinterpreted) -> fp32, exactly."""
        bits = as_bits(raw, KIND)
        if HW:
            x = hw_widen(bits, KIND, 0)
        else:
            if KIND == F32:
                code = bits
            else:
                code = bits.to(tl.int32) & 0xFFFF
            x = int_widen(code, KIND).to(tl.float32, bitcast=True)
        return x

    @triton.jit
    def _narrow(x, KIND: tl.constexpr, HW: tl.constexpr, SAT: tl.constexpr):
        """fp32 -> storage bits of KIND, rounded to nearest even as torch rounds."""
        if HW:
            r = hw_narrow(x, KIND, SAT, 0)
        else:
            r = to_storage(int_narrow(x.to(tl.int32, bitcast=True), KIND, SAT), KIND)
        return r

    @triton.jit
    def _to_cache(bits, inv, IN: tl.constexpr, OUT: tl.constexpr, SCALED: tl.constexpr, HW: tl.constexpr,
                  SAT: tl.constexpr, FP8_INT: tl.constexpr, POW2: tl.constexpr):
        """Input storage bits -> cache storage bits (convert_for_cache's rounding)."""
        if IN == OUT:
            r = bits
        else:
            r = to_storage(convert_bits(bits, inv, IN, OUT, SCALED, HW, SAT, FP8_INT, POW2, 0), OUT)
        return r

    @triton.jit
    def _rope_heads(base, rmask, cos, sin, KIND: tl.constexpr, HW: tl.constexpr, SAT: tl.constexpr,
                    NEOX: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_HALF: tl.constexpr, EVICT: tl.constexpr):
        """Rotate the first 2 * HALF dims of a [BLOCK_T, BLOCK_H] tile of head rows at ``base``
        in fp32, round once to KIND and write them back in place. Returns the rounded bits:
        NeoX the two halves, GPT-J the interleaved dims (twice). ``EVICT``: the loads' L2
        eviction policy ("" the default)."""
        if NEOX:
            half = tl.arange(0, BLOCK_HALF)
            m = rmask & (half[None, None, :] < HALF)
            xo = base + half[None, None, :]
            x = _widen(tl.load(xo, mask=m, eviction_policy=EVICT), KIND, HW)
            y = _widen(tl.load(xo + HALF, mask=m, eviction_policy=EVICT), KIND, HW)
            first = _narrow(x * cos - y * sin, KIND, HW, SAT)
            second = _narrow(x * sin + y * cos, KIND, HW, SAT)
            tl.store(xo, first.to(base.dtype.element_ty, bitcast=True), mask=m)
            tl.store(xo + HALF, second.to(base.dtype.element_ty, bitcast=True), mask=m)
        else:
            pair = tl.arange(0, 2 * BLOCK_HALF)
            m = rmask & (pair[None, None, :] < 2 * HALF)
            xo = base + pair[None, None, :]
            raw = tl.load(xo, mask=m, eviction_policy=EVICT)
            x, y = tl.split(tl.reshape(_widen(raw, KIND, HW), [BLOCK_T, BLOCK_H, BLOCK_HALF, 2]))
            rx = _narrow(x * cos - y * sin, KIND, HW, SAT)
            ry = _narrow(x * sin + y * cos, KIND, HW, SAT)
            first = tl.reshape(tl.join(rx, ry), [BLOCK_T, BLOCK_H, 2 * BLOCK_HALF])
            second = first
            tl.store(xo, first.to(base.dtype.element_ty, bitcast=True), mask=m)
        return first, second

    @triton.jit
    def _rope_tile(
        pid, group, q, k, v, k_out, v_out, loc, pos, cos_sin, k_inv, v_inv, tokens, rows, max_pos,
        q_st, q_sh, k_st, k_sh, v_st, v_sh, loc_st, pos_st, cs_st,
        HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, HALF: tl.constexpr,
        BLOCK_HALF: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, MODE: tl.constexpr,
    ):
        """One tile: tokens [pid*BLOCK_T, (pid+1)*BLOCK_T) of head group ``group`` (see
        :func:`rope_kv_kernel`)."""
        QIN: tl.constexpr = MODE & 7
        IN: tl.constexpr = (MODE >> 3) & 7
        OUT: tl.constexpr = (MODE >> 6) & 7
        K_SCALED: tl.constexpr = (MODE >> 9) & 1
        V_SCALED: tl.constexpr = (MODE >> 10) & 1
        HW: tl.constexpr = (MODE >> 11) & 1
        SAT: tl.constexpr = (MODE >> 12) & 1
        WIDE: tl.constexpr = (MODE >> 13) & 1
        FP8_INT: tl.constexpr = (MODE >> 15) & 1
        POW2: tl.constexpr = (MODE >> 16) & 1
        NEOX: tl.constexpr = (MODE >> 17) & 1
        STORE: tl.constexpr = (MODE >> 18) & 1
        STREAM: tl.constexpr = (MODE >> 20) & 1
        ROPE: tl.constexpr = 2 * HALF
        Q_GROUPS: tl.constexpr = (HQ + BLOCK_HQ - 1) // BLOCK_HQ
        # STREAM: the inputs are read once and the cache rows are not read back by this step's
        # kernels soon, so loads are evicted first and cache rows stored streaming (.cs)
        EVICT: tl.constexpr = "evict_first" if STREAM else ""
        ROWS: tl.constexpr = ".cs" if STREAM else ""
        if WIDE:
            tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        else:
            tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = tok < tokens
        p = tl.load(pos + tok * pos_st, mask=tmask, other=0)
        # a position outside the cos/sin table: the token is neither rotated nor stored (as
        # rope_cuda_fused skips it), never a read past the table (checking positions on the host
        # is a device sync, which a CUDA graph capture forbids)
        tmask = tmask & (p >= 0) & (p < max_pos)
        if WIDE:
            p = p.to(tl.int64)
        half = tl.arange(0, BLOCK_HALF)
        cmask = tmask[:, None] & (half[None, :] < HALF)
        cs_row = cos_sin + p[:, None] * cs_st
        cos = tl.load(cs_row + half[None, :], mask=cmask, other=0.0)[:, None, :]  # [BLOCK_T, 1, BLOCK_HALF]
        sin = tl.load(cs_row + HALF + half[None, :], mask=cmask, other=0.0)[:, None, :]

        if group < Q_GROUPS:
            # (names of their own in each branch: the compiler merges same-named values, and
            # the q and k tiles differ in shape)
            hq = group * BLOCK_HQ + tl.arange(0, BLOCK_HQ)
            qmask = tmask[:, None, None] & (hq[None, :, None] < HQ)  # [BLOCK_T, BLOCK_HQ, 1]
            _rope_heads(q + tok[:, None, None] * q_st + hq[None, :, None] * q_sh, qmask, cos, sin, QIN, HW, SAT,
                        NEOX, HALF, BLOCK_T, BLOCK_HQ, BLOCK_HALF, EVICT)
        else:
            h = (group - Q_GROUPS) * BLOCK_HK + tl.arange(0, BLOCK_HK)
            rmask = tmask[:, None, None] & (h[None, :, None] < HK)
            k_in = k + tok[:, None, None] * k_st + h[None, :, None] * k_sh
            if STORE:  # the slots and v first: their loads do not wait for the rotation
                slot = tl.load(loc + tok * loc_st, mask=tmask, other=-1)
                dv = tl.arange(0, BLOCK_DV)[None, None, :]
                dm = dv < DV
                vb = as_bits(tl.load(v + tok[:, None, None] * v_st + h[None, :, None] * v_sh + dv, mask=rmask & dm,
                                     eviction_policy=EVICT), IN)
            first, second = _rope_heads(k_in, rmask, cos, sin, IN, HW, SAT, NEOX, HALF, BLOCK_T, BLOCK_HK,
                                        BLOCK_HALF, EVICT)
            if STORE:
                ok = tmask & (slot >= 0) & (slot < rows)  # never write outside the buffer
                if WIDE:
                    row = slot.to(tl.int64)
                else:
                    row = slot.to(tl.int32)
                wmask = ok[:, None, None] & (h[None, :, None] < HK)
                k_row = k_out + row[:, None, None] * (HK * D) + h[None, :, None] * D
                if NEOX:
                    wm = wmask & (half[None, None, :] < HALF)
                    ko = k_row + half[None, None, :]
                    tl.store(ko, _to_cache(first, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2)
                             .to(k_out.dtype.element_ty, bitcast=True), mask=wm, cache_modifier=ROWS)
                    tl.store(ko + HALF, _to_cache(second, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2)
                             .to(k_out.dtype.element_ty, bitcast=True), mask=wm, cache_modifier=ROWS)
                else:
                    pair = tl.arange(0, 2 * BLOCK_HALF)
                    tl.store(k_row + pair[None, None, :],
                             _to_cache(first, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2)
                             .to(k_out.dtype.element_ty, bitcast=True), mask=wmask & (pair[None, None, :] < ROPE),
                             cache_modifier=ROWS)
                if BLOCK_P > 0:  # partial rotary: the dims past rope_dim go to the cache unrotated
                    rest = ROPE + tl.arange(0, BLOCK_P)[None, None, :]
                    pm = rest < D
                    kp = as_bits(tl.load(k_in + rest, mask=rmask & pm), IN)
                    tl.store(k_row + rest, _to_cache(kp, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2)
                             .to(k_out.dtype.element_ty, bitcast=True), mask=wmask & pm, cache_modifier=ROWS)
                tl.store(v_out + row[:, None, None] * (HK * DV) + h[None, :, None] * DV + dv,
                         _to_cache(vb, v_inv, IN, OUT, V_SCALED, HW, SAT, FP8_INT, POW2)
                         .to(v_out.dtype.element_ty, bitcast=True), mask=wmask & dm, cache_modifier=ROWS)

    @triton.jit(do_not_specialize=["tokens", "rows", "max_pos"])
    def rope_kv_kernel(
        q, k, v, k_out, v_out, loc, pos, cos_sin,
        k_inv, v_inv,
        tokens, rows, max_pos,
        q_st, q_sh, k_st, k_sh, v_st, v_sh, loc_st, pos_st, cs_st,
        HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, HALF: tl.constexpr,
        BLOCK_HALF: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, MODE: tl.constexpr,
    ):
        """Program (p, g) owns tokens [p*BLOCK_T, (p+1)*BLOCK_T) and head group g: BLOCK_HQ q
        heads for g < cdiv(HQ, BLOCK_HQ), else BLOCK_HK k heads (and, with STORE, the same v
        heads): a GQA model's few k heads do not pad to the q heads' block. ``HALF``:
        rope_dim / 2; ``BLOCK_P``: the padded pass-through dims D - rope_dim (0: none);
        the cache rows are [slot, HK * D] and [slot, HK * DV], row-major."""
        PDL: tl.constexpr = (MODE >> 14) & 1
        TOKEN_MAJOR: tl.constexpr = (MODE >> 19) & 1
        PERSISTENT: tl.constexpr = (MODE >> 21) & 1
        GROUPS: tl.constexpr = (HQ + BLOCK_HQ - 1) // BLOCK_HQ + (HK + BLOCK_HK - 1) // BLOCK_HK

        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        if PERSISTENT:  # a fixed grid walks the token-major tiles, each program every num_programs-th
            tiles = tl.cdiv(tokens, BLOCK_T) * GROUPS
            for flat in range(tl.program_id(0), tiles, tl.num_programs(0)):
                _rope_tile(flat // GROUPS, flat % GROUPS, q, k, v, k_out, v_out, loc, pos, cos_sin, k_inv, v_inv,
                           tokens, rows, max_pos, q_st, q_sh, k_st, k_sh, v_st, v_sh, loc_st, pos_st, cs_st,
                           HQ, HK, D, DV, HALF, BLOCK_HALF, BLOCK_P, BLOCK_DV, BLOCK_T, BLOCK_HQ, BLOCK_HK, MODE)
        else:
            if TOKEN_MAJOR:
                flat = tl.program_id(0)
                pid = flat // GROUPS
                group = flat % GROUPS
            else:
                pid = tl.program_id(0)
                group = tl.program_id(1)
            _rope_tile(pid, group, q, k, v, k_out, v_out, loc, pos, cos_sin, k_inv, v_inv,
                       tokens, rows, max_pos, q_st, q_sh, k_st, k_sh, v_st, v_sh, loc_st, pos_st, cs_st,
                       HQ, HK, D, DV, HALF, BLOCK_HALF, BLOCK_P, BLOCK_DV, BLOCK_T, BLOCK_HQ, BLOCK_HK, MODE)
