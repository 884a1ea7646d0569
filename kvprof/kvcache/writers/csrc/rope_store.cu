// kvprof's rope + K/V store: one launch rotates q and k in place (GPT-NeoX halves or GPT-J
// pairs, partial rotary), stores the rotated k and the v rows at their slots, converting to
// the cache's dtype on the way (bf16/fp16 as is, fp8 e4m3/e5m2 with a per-tensor scale).
//
// Why it is written this way:
// * Decode writes a few tokens, so a row per warp leaves most of a warp idle (one bf16 row of
//   128 dims is 16 vectors of 16 bytes). Every thread does one "item" instead:
//     q row: its rope items only (dims from rope_dim on stay as they are, in place);
//     k row: its rope items, then one item per vector of the unrotated dims (stored as is);
//     v row: one item per vector.
//   A NeoX rope item is a vector of the first half and its partner vector rope_dim/2 further;
//   a GPT-J rope item is one vector (its pairs are inside it). Llama-3.1-70B TP8 (8 q heads,
//   1 KV head x 128, NeoX) is 8*8 + 8 + 16 = 88 threads per token, one block at decode.
// * A vector is 16 bytes (8 bf16/fp16 elements) where every row, stride and pointer allows
//   (checked on the host), else 4 bytes (2 elements).
// * q may be bf16 with fp16 k/v or the other way round (same size: the same item split).
// * The rotation is float32 with each product rounded (x*c - y*s, y*c + x*s, no fused
//   multiply-add): the reference's arithmetic, then one rounding to the input dtype.
// * The cache gets exactly what kvprof.kvcache.dtypes.convert_for_cache makes of the rotated k (as
//   written back in place) and of v: (x.float() * fp32(1/scale)).to(x.dtype).to(fp8), fp8 by
//   the hardware cvt.rn.satfinite with the fix-up to c10's overflow rule (as store_kv.cu).
// * Slots outside [0, rows) are never written; a token whose position lies outside the cos/sin
//   table is left alone entirely (q and k not rotated, nothing stored), never read past it.
// * Optional programmatic dependent launch: griddepcontrol.wait before the first load,
//   launch_dependents right away; both are no-ops when launched without the attribute.

#include "rope_store.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvprof_rope {
namespace {

struct Params {
  void* q;
  void* k;
  const void* v;
  void* k_out;
  void* v_out;
  const void* loc;
  const void* pos;
  const float* cos_sin;
  long long q_tok, q_head, k_tok, k_head, v_tok, v_head;  // in elements
  long long loc_stride, pos_stride, cs_stride;
  long long tokens, rows, max_pos;
  int hk, dim, v_dim, rope_dim, half;
  int rot_items;  // rope items per q or k row
  int k_items;    // rope items + vectors of unrotated dims, per k row
  int v_items;    // vectors per v row
  int q_total;    // items of a token's q rows
  int k_total;    // items of a token's k rows
  int per_token;  // all items of a token
  float k_inv, v_inv;
  bool k_scaled, v_scaled;
  bool k_exact, v_exact;  // power-of-two scale from bf16: skip the round trip (exact there)
  bool q_other;  // q is the other 16-bit type (fp16 q with bf16 k, or bf16 q with fp16 k)
  bool loc64, pos64, e4m3_sat, pdl;
};

template <int K> struct Elem;
template <> struct Elem<BF16> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ float widen(T x) { return __bfloat162float(x); }
  static __device__ __forceinline__ T narrow(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Elem<F16> {
  using T = __half;
  static __device__ __forceinline__ float widen(T x) { return __half2float(x); }
  static __device__ __forceinline__ T narrow(float x) { return __float2half_rn(x); }
};

// The cache's element: the input's own type, or a byte for fp8.
template <int IN, int OUT> struct OutElem {
  using T = typename Elem<IN>::T;
};
template <int IN> struct OutElem<IN, E4M3> {
  using T = uint8_t;
};
template <int IN> struct OutElem<IN, E5M2> {
  using T = uint8_t;
};

template <int BYTES> struct Word;
template <> struct Word<16> {
  using U = uint4;
};
template <> struct Word<8> {
  using U = uint2;
};
template <> struct Word<4> {
  using U = uint32_t;
};
template <> struct Word<2> {
  using U = uint16_t;
};

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load(const T* p) {  // q and k: written by this kernel
  using U = typename Word<sizeof(T) * N>::U;
  const U w = *reinterpret_cast<const U*>(p);
  Vec<T, N> x;
  memcpy(&x, &w, sizeof(U));
  return x;
}

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_ro(const T* p) {  // v: read-only here (.nc)
  using U = typename Word<sizeof(T) * N>::U;
  const U w = __ldg(reinterpret_cast<const U*>(p));
  Vec<T, N> x;
  memcpy(&x, &w, sizeof(U));
  return x;
}

template <typename T, int N>
__device__ __forceinline__ void store(T* p, const Vec<T, N>& x) {
  using U = typename Word<sizeof(T) * N>::U;
  U w;
  memcpy(&w, &x, sizeof(U));
  *reinterpret_cast<U*>(p) = w;
}

// M consecutive floats of the cos/sin table (16- or 8-byte loads where M allows; the host
// checked the table's alignment for the vector width).
template <int M>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[M]) {
  if constexpr (M % 4 == 0) {
#pragma unroll
    for (int i = 0; i < M; i += 4) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p + i));
      out[i] = f.x;
      out[i + 1] = f.y;
      out[i + 2] = f.z;
      out[i + 3] = f.w;
    }
  } else if constexpr (M % 2 == 0) {
#pragma unroll
    for (int i = 0; i < M; i += 2) {
      const float2 f = __ldg(reinterpret_cast<const float2*>(p + i));
      out[i] = f.x;
      out[i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < M; ++i) out[i] = __ldg(p + i);
  }
}

__device__ __forceinline__ long long load_index(const void* p, bool is64, long long i) {
  return is64 ? __ldg(static_cast<const long long*>(p) + i)
              : static_cast<long long>(__ldg(static_cast<const int*>(p) + i));
}

// One rotated pair, each product rounded to float32 (no contraction into an FMA).
__device__ __forceinline__ void rotate(float x, float y, float c, float s, float& ox, float& oy) {
  ox = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  oy = __fadd_rn(__fmul_rn(y, c), __fmul_rn(x, s));
}

// Hardware fp32 -> fp8 for two elements (the low byte is `a`), round to nearest even,
// satfinite, fixed up to c10's overflow rule (the same rule and bits as store_kv.cu).
template <int K> __device__ __forceinline__ uint16_t fp8x2(float a, float b, bool e4m3_sat);
template <> __device__ __forceinline__ uint16_t fp8x2<E4M3>(float a, float b, bool e4m3_sat) {
  const uint16_t c = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  if (e4m3_sat) return c;  // +-448 above 464, as c10 >= 2.12
  return static_cast<uint16_t>(c | (fabsf(a) > 464.0f ? 0x001 : 0) | (fabsf(b) > 464.0f ? 0x100 : 0));  // NaN
}
template <> __device__ __forceinline__ uint16_t fp8x2<E5M2>(float a, float b, bool) {
  const uint16_t c = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2);
  // satfinite gives +-57344 (0x7B|s) from 61440 on, c10 gives inf (0x7C|s): no carry across bytes
  return static_cast<uint16_t>(c + (fabsf(a) >= 61440.0f ? 0x001 : 0) + (fabsf(b) >= 61440.0f ? 0x100 : 0));
}

// convert_for_cache's value before the final rounding: x.float() * inv rounded to the input
// dtype, or x.float().
template <int IN>
__device__ __forceinline__ float scaled(typename Elem<IN>::T x, float inv, bool on, bool exact) {
  float f = Elem<IN>::widen(x);
  if (on) {
    f = f * inv;
    if (!exact) f = Elem<IN>::widen(Elem<IN>::narrow(f));
  }
  return f;
}

// One vector of N input elements into the cache at `out` (N cache elements).
template <int IN, int OUT, int N>
__device__ __forceinline__ void store_out(typename OutElem<IN, OUT>::T* out, const Vec<typename Elem<IN>::T, N>& x,
                                          float inv, bool on, bool exact, bool e4m3_sat) {
  if constexpr (OUT == IN) {
    store<typename Elem<IN>::T, N>(out, x);
  } else {
    static_assert(OUT == E4M3 || OUT == E5M2, "the cache is the input's dtype or fp8");
    uint16_t pairs[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      pairs[i] = fp8x2<OUT>(scaled<IN>(x.v[2 * i], inv, on, exact), scaled<IN>(x.v[2 * i + 1], inv, on, exact),
                            e4m3_sat);
    }
    // packed in registers (a byte array would go through local memory)
    if constexpr (N == 8) {
      *reinterpret_cast<uint2*>(out) = make_uint2(pairs[0] | static_cast<uint32_t>(pairs[1]) << 16,
                                                  pairs[2] | static_cast<uint32_t>(pairs[3]) << 16);
    } else {
      static_assert(N == 2, "vectors are 8 or 2 elements");
      *reinterpret_cast<uint16_t*>(out) = pairs[0];
    }
  }
}

// One rope item of a q or k row (its elements from `e`), rotated in place; returns the rotated
// vector(s), which a k row also stores into the cache (GPT-J: `y` is unused).
template <int IN, int N> struct Rotated {
  Vec<typename Elem<IN>::T, N> x, y;
};

template <int IN, int N, bool NEOX>
__device__ __forceinline__ Rotated<IN, N> rope_in_place(typename Elem<IN>::T* row, int e, const float* cs, int half) {
  using E = Elem<IN>;
  using T = typename E::T;
  Rotated<IN, N> r;
  if constexpr (NEOX) {
    r.x = load<T, N>(row + e);
    r.y = load<T, N>(row + half + e);
    float c[N], s[N];
    load_floats<N>(cs + e, c);
    load_floats<N>(cs + half + e, s);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float ox, oy;
      rotate(E::widen(r.x.v[j]), E::widen(r.y.v[j]), c[j], s[j], ox, oy);
      r.x.v[j] = E::narrow(ox);
      r.y.v[j] = E::narrow(oy);
    }
    store<T, N>(row + e, r.x);
    store<T, N>(row + half + e, r.y);
  } else {
    r.x = load<T, N>(row + e);
    float c[N / 2], s[N / 2];
    load_floats<N / 2>(cs + e / 2, c);
    load_floats<N / 2>(cs + half + e / 2, s);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      float ox, oy;
      rotate(E::widen(r.x.v[2 * j]), E::widen(r.x.v[2 * j + 1]), c[j], s[j], ox, oy);
      r.x.v[2 * j] = E::narrow(ox);
      r.x.v[2 * j + 1] = E::narrow(oy);
    }
    store<T, N>(row + e, r.x);
  }
  return r;
}

template <int IN, int OUT, int N, bool NEOX>
__global__ void __launch_bounds__(512) rope_store_kernel(const __grid_constant__ Params p) {
  using T = typename Elem<IN>::T;
  using O = typename OutElem<IN, OUT>::T;
  constexpr int kOther = IN == BF16 ? F16 : BF16;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
#endif
  const long long total = p.tokens * p.per_token;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const long long t = i / p.per_token;
    int r = static_cast<int>(i - t * p.per_token);
    const long long pos = load_index(p.pos, p.pos64, t * p.pos_stride);
    const bool pos_ok = pos >= 0 && pos < p.max_pos;
    const float* cs = p.cos_sin + (pos_ok ? pos : 0) * p.cs_stride;
    if (r < p.q_total) {  // q: rotate in place (q may be the other 16-bit type than k)
      const int head = r / p.rot_items;
      const int e = (r - head * p.rot_items) * N;
      const long long at = t * p.q_tok + head * p.q_head;
      if (!pos_ok) continue;
      if (p.q_other) {
        rope_in_place<kOther, N, NEOX>(static_cast<typename Elem<kOther>::T*>(p.q) + at, e, cs, p.half);
      } else {
        rope_in_place<IN, N, NEOX>(static_cast<T*>(p.q) + at, e, cs, p.half);
      }
      continue;
    }
    r -= p.q_total;
    const long long slot = load_index(p.loc, p.loc64, t * p.loc_stride);
    const bool stored = pos_ok && slot >= 0 && slot < p.rows;
    if (r < p.k_total) {  // k: rotate in place and store; its unrotated dims: store
      const int head = r / p.k_items;
      const int item = r - head * p.k_items;
      T* row = static_cast<T*>(p.k) + t * p.k_tok + head * p.k_head;
      O* out = stored ? static_cast<O*>(p.k_out) + (slot * p.hk + head) * p.dim : nullptr;
      if (item < p.rot_items) {
        if (!pos_ok) continue;
        const int e = item * N;
        const Rotated<IN, N> rot = rope_in_place<IN, N, NEOX>(row, e, cs, p.half);
        if (out != nullptr) {
          store_out<IN, OUT, N>(out + e, rot.x, p.k_inv, p.k_scaled, p.k_exact, p.e4m3_sat);
          if constexpr (NEOX) {
            store_out<IN, OUT, N>(out + p.half + e, rot.y, p.k_inv, p.k_scaled, p.k_exact, p.e4m3_sat);
          }
        }
      } else if (out != nullptr) {
        const int e = p.rope_dim + (item - p.rot_items) * N;
        store_out<IN, OUT, N>(out + e, load<T, N>(row + e), p.k_inv, p.k_scaled, p.k_exact, p.e4m3_sat);
      }
    } else if (stored) {  // v: store
      r -= p.k_total;
      const int head = r / p.v_items;
      const int e = (r - head * p.v_items) * N;
      const T* row = static_cast<const T*>(p.v) + t * p.v_tok + head * p.v_head;
      O* out = static_cast<O*>(p.v_out) + (slot * p.hk + head) * p.v_dim;
      store_out<IN, OUT, N>(out + e, load_ro<T, N>(row + e), p.v_inv, p.v_scaled, p.v_exact, p.e4m3_sat);
    }
  }
}

template <int IN, int OUT, int N, bool NEOX>
cudaError_t launch(Params p, const RopeStoreArgs& a, cudaStream_t stream) {
  // items per row, from the vector width (the host checked that every length divides)
  if (a.dim % N || a.v_dim % N || a.rope_dim % (NEOX ? 2 * N : N)) return cudaErrorInvalidValue;
  p.rot_items = NEOX ? a.rope_dim / (2 * N) : a.rope_dim / N;
  p.k_items = p.rot_items + (a.dim - a.rope_dim) / N;
  p.v_items = a.v_dim / N;
  p.q_total = a.hq * p.rot_items;
  p.k_total = a.hk * p.k_items;
  p.per_token = p.q_total + p.k_total + a.hk * p.v_items;
  if (p.per_token <= 0) return cudaSuccess;
  const long long total = p.tokens * p.per_token;
  const int threads = a.threads;
  long long blocks = (total + threads - 1) / threads;
  const long long cap = static_cast<long long>(a.blocks_per_sm) * a.sms;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
  cfg.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (a.pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, rope_store_kernel<IN, OUT, N, NEOX>, p);
}

template <int IN, int OUT>
cudaError_t by_shape(const Params& p, const RopeStoreArgs& a, cudaStream_t stream) {
  if (a.vec == 8) return a.neox ? launch<IN, OUT, 8, true>(p, a, stream) : launch<IN, OUT, 8, false>(p, a, stream);
  if (a.vec == 2) return a.neox ? launch<IN, OUT, 2, true>(p, a, stream) : launch<IN, OUT, 2, false>(p, a, stream);
  return cudaErrorInvalidValue;
}

template <int IN>
cudaError_t by_out(const Params& p, const RopeStoreArgs& a, cudaStream_t stream) {
  if (a.out_kind == IN) return by_shape<IN, IN>(p, a, stream);
  if (a.out_kind == E4M3) return by_shape<IN, E4M3>(p, a, stream);
  if (a.out_kind == E5M2) return by_shape<IN, E5M2>(p, a, stream);
  return cudaErrorInvalidValue;
}

// A finite power of two (frexp's mantissa is exactly 0.5).
bool pow2(float x) {
  int e = 0;
  return std::isfinite(x) && std::frexp(x, &e) == 0.5f;
}

}  // namespace

int rope_store_launch(const RopeStoreArgs& a, cudaStream_t stream) {
  if (a.tokens <= 0) return cudaSuccess;
  if (a.threads < 32 || a.threads > 512 || a.blocks_per_sm < 1 || a.sms < 1) return cudaErrorInvalidValue;
  if (a.rope_dim < 2 || a.rope_dim > a.dim || a.rope_dim % 2) return cudaErrorInvalidValue;
  Params p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.k_out = a.k_out;
  p.v_out = a.v_out;
  p.loc = a.loc;
  p.pos = a.pos;
  p.cos_sin = a.cos_sin;
  p.q_tok = a.q_tok;
  p.q_head = a.q_head;
  p.k_tok = a.k_tok;
  p.k_head = a.k_head;
  p.v_tok = a.v_tok;
  p.v_head = a.v_head;
  p.loc_stride = a.loc_stride;
  p.pos_stride = a.pos_stride;
  p.cs_stride = a.cs_stride;
  p.tokens = a.tokens;
  p.rows = a.rows;
  p.max_pos = a.max_pos;
  p.hk = a.hk;
  p.dim = a.dim;
  p.v_dim = a.v_dim;
  p.rope_dim = a.rope_dim;
  p.half = a.rope_dim / 2;
  p.k_inv = a.k_inv;
  p.v_inv = a.v_inv;
  const bool fp8 = a.out_kind == E4M3 || a.out_kind == E5M2;
  p.k_scaled = fp8 && a.k_scaled;
  p.v_scaled = fp8 && a.v_scaled;
  // bf16 has fp32's exponent range: times a power of two it stays exact for anything fp8 can
  // see (the rule of store_kv.cu and triton_fused's _pow2_exact)
  p.k_exact = a.in_kind == BF16 && p.k_scaled && pow2(a.k_inv);
  p.v_exact = a.in_kind == BF16 && p.v_scaled && pow2(a.v_inv);
  if ((a.q_kind != BF16 && a.q_kind != F16) || (a.in_kind != BF16 && a.in_kind != F16)) return cudaErrorInvalidValue;
  p.q_other = a.q_kind != a.in_kind;
  p.loc64 = a.loc64;
  p.pos64 = a.pos64;
  p.e4m3_sat = a.e4m3_sat;
  p.pdl = a.pdl;
  if (a.in_kind == BF16) return by_out<BF16>(p, a, stream);
  if (a.in_kind == F16) return by_out<F16>(p, a, stream);
  return cudaErrorInvalidValue;
}

}  // namespace kvprof_rope
