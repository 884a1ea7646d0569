// kvprof's fused K+V cache store: one kernel launch writes the K and V rows of every token
// at its slot, converting the dtype on the way.
//
// Why it is written this way:
// * Each block row (threadIdx.y) handles one token at a time, threadIdx.x walks the row in
//   vectors (16 bytes when rows, strides and pointers allow; checked on the host, scalar
//   fallback otherwise). Small rows therefore put several tokens in one block.
// * Every thread issues its K and V row loads, then the slot load (predicated PTX loads, so
//   they stay in that order and in one basic block); the slot is only used by the stores,
//   so the slot's latency and the rows' overlap.
// * Slots outside [0, rows) are never written (the pool validates them already).
// * Conversions are torch's: __float2bfloat16_rn / __float2half_rn, and for fp8 either c10's
//   Float8_e4m3fn / Float8_e5m2 constructors (the reference routine) or, by default, the
//   hardware cvt.rn.satfinite (two elements per instruction) plus a fix-up to c10's
//   overflow rule (same bits, verified exhaustively on the H200; c10's integer routine
//   makes large fp8 writes compute-bound). Power-of-two scales from bf16/fp32 skip the
//   round trip through the input dtype (exact there).
//   Results are bitwise those of (x.float() * inv).to(x.dtype).to(cache_dtype), NaN aside.
// * Optional programmatic dependent launch: griddepcontrol.wait before the first load,
//   launch_dependents right away; both are no-ops when launched without the attribute.
//
// The launcher below is called from store_kv.cpp (the torch binding); this file needs only
// the CUDA and c10 header-only types, so it compiles fast and separately.

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvprof {

// Element kinds: the order is shared with kvprof/kvcache/writers/triton_fused.py (KINDS).
enum Kind : int { F32 = 0, BF16 = 1, F16 = 2, E4M3 = 3, E5M2 = 4 };

struct Params {
  void* k_out;
  void* v_out;
  const void* loc;
  const void* k_in;
  const void* v_in;
  long long k_stride;  // input token strides, in vectors
  long long v_stride;
  long long tokens;
  long long rows;
  int nk;  // vectors per K row
  int nv;  // vectors per V row
  float k_inv;
  float v_inv;
  bool k_scaled;
  bool v_scaled;
  bool k_exact;  // scaled by a power of two from bf16/fp32 into fp8: skip the round trip
  bool v_exact;
  bool loc64;
  bool e4m3_sat;  // hw fp8 path: torch saturates e4m3 overflow (>= 2.12) or makes it NaN
  bool pdl;
};

template <int K> struct KindT;
template <> struct KindT<F32> {
  using T = float;
  static __device__ __forceinline__ float widen(T x) { return x; }
  static __device__ __forceinline__ T narrow(float x) { return x; }
};
template <> struct KindT<BF16> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ float widen(T x) { return __bfloat162float(x); }
  static __device__ __forceinline__ T narrow(float x) { return __float2bfloat16_rn(x); }
};
template <> struct KindT<F16> {
  using T = __half;
  static __device__ __forceinline__ float widen(T x) { return __half2float(x); }
  static __device__ __forceinline__ T narrow(float x) { return __float2half_rn(x); }
};
template <> struct KindT<E4M3> {
  using T = uint8_t;
  static __device__ __forceinline__ float widen(T x) {
    return static_cast<float>(c10::Float8_e4m3fn(x, c10::Float8_e4m3fn::from_bits()));
  }
  static __device__ __forceinline__ T narrow(float x) { return c10::Float8_e4m3fn(x).x; }
};
template <> struct KindT<E5M2> {
  using T = uint8_t;
  static __device__ __forceinline__ float widen(T x) {
    return static_cast<float>(c10::Float8_e5m2(x, c10::Float8_e5m2::from_bits()));
  }
  static __device__ __forceinline__ T narrow(float x) { return c10::Float8_e5m2(x).x; }
};

// Hardware fp32 -> fp8 (round to nearest even, satfinite), fixed up to c10's overflow rule.
template <int K> __device__ __forceinline__ uint8_t hw_fp8(float x, bool e4m3_sat);
template <> __device__ __forceinline__ uint8_t hw_fp8<E4M3>(float x, bool e4m3_sat) {
  uint8_t c = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  // satfinite: +-448 (0x7E|s) above 464; old c10 gives NaN (0x7F|s) there
  return e4m3_sat ? c : static_cast<uint8_t>(c | (fabsf(x) > 464.0f ? 1 : 0));
}
template <> __device__ __forceinline__ uint8_t hw_fp8<E5M2>(float x, bool) {
  uint8_t c = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  // satfinite: +-57344 (0x7B|s) from 61440 on; c10 gives inf (0x7C|s)
  return static_cast<uint8_t>(c + (fabsf(x) >= 61440.0f ? 1 : 0));
}

// Two elements at once (cvt.rn.satfinite.{e4m3,e5m2}x2.f32: one instruction per pair; the
// low byte is `a`), with the same fix-up per element.
template <int K> __device__ __forceinline__ uint16_t hw_fp8x2(float a, float b, bool e4m3_sat);
template <> __device__ __forceinline__ uint16_t hw_fp8x2<E4M3>(float a, float b, bool e4m3_sat) {
  uint16_t c = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  if (e4m3_sat) return c;
  return static_cast<uint16_t>(c | (fabsf(a) > 464.0f ? 0x001 : 0) | (fabsf(b) > 464.0f ? 0x100 : 0));
}
template <> __device__ __forceinline__ uint16_t hw_fp8x2<E5M2>(float a, float b, bool) {
  uint16_t c = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2);
  // 0x7B|s + 1 = 0x7C|s: no carry into the other byte
  return static_cast<uint16_t>(c + (fabsf(a) >= 61440.0f ? 0x001 : 0) + (fabsf(b) >= 61440.0f ? 0x100 : 0));
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// A predicated read-only load as inline PTX. Volatile asm keeps the program order of the
// row loads and the slot load (the compiler may neither sink the row loads below the slot
// test nor into its branch), and predication keeps them in one basic block, so ptxas issues
// them back to back: the slot's latency overlaps the rows'.
template <typename T>
__device__ __forceinline__ T ld_pred(const T* src, bool pred) {
  static_assert(sizeof(T) == 16 || sizeof(T) == 8 || sizeof(T) == 4 || sizeof(T) == 2 || sizeof(T) == 1,
                "unsupported load width");
  T out;
  const int p = pred;
  if constexpr (sizeof(T) == 16) {
    uint32_t r0 = 0, r1 = 0, r2 = 0, r3 = 0;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "+r"(r0), "+r"(r1), "+r"(r2), "+r"(r3)
        : "l"(src), "r"(p));
    const uint32_t r[4] = {r0, r1, r2, r3};
    memcpy(&out, r, 16);
  } else if constexpr (sizeof(T) == 8) {
    unsigned long long r = 0;
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u64 %0, [%1];\n}\n"
                 : "+l"(r)
                 : "l"(src), "r"(p));
    memcpy(&out, &r, 8);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t r = 0;
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u32 %0, [%1];\n}\n"
                 : "+r"(r)
                 : "l"(src), "r"(p));
    memcpy(&out, &r, 4);
  } else if constexpr (sizeof(T) == 2) {
    unsigned short r = 0;
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u16 %0, [%1];\n}\n"
                 : "+h"(r)
                 : "l"(src), "r"(p));
    memcpy(&out, &r, 2);
  } else {
    uint32_t r = 0;
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.u8 %0, [%1];\n}\n"
                 : "+r"(r)
                 : "l"(src), "r"(p));
    const uint8_t b = static_cast<uint8_t>(r);
    memcpy(&out, &b, 1);
  }
  return out;
}

// One element, before the final rounding: x.float() * inv rounded to IN, or x.float().
// `exact`: inv is a power of two and IN is bf16/fp32, so the product is exact and rounding
// it to IN changes nothing that fp8 could see (kvprof/kvcache/writers/triton_fused.py, _pow2_exact).
template <int IN>
__device__ __forceinline__ float scaled_input(typename KindT<IN>::T x, float inv, bool scaled, bool exact) {
  float f = KindT<IN>::widen(x);
  if (scaled) {
    f = f * inv;
    if (IN != F32 && !exact) f = KindT<IN>::widen(KindT<IN>::narrow(f));
  }
  return f;
}

// One element: (x.float() * inv).to(IN).to(OUT), or x.to(OUT) when not scaled.
template <int IN, int OUT, bool HW_FP8>
__device__ __forceinline__ typename KindT<OUT>::T convert1(typename KindT<IN>::T x, float inv, bool scaled,
                                                             bool exact, bool e4m3_sat) {
  const float f = scaled_input<IN>(x, inv, scaled, exact);
  if constexpr (HW_FP8 && (OUT == E4M3 || OUT == E5M2)) {
    return hw_fp8<OUT>(f, e4m3_sat);
  } else {
    return KindT<OUT>::narrow(f);
  }
}

// Unit of work = one vector of N elements. Copy: the same bits (any kind), N bytes-wide units.
template <typename U> struct CopyOp {
  using In = U;
  using Out = U;
  static constexpr int kUnroll = 2;  // vectors of K and of V in flight per thread and step
  static __device__ __forceinline__ Out k(const In& x, const Params&) { return x; }
  static __device__ __forceinline__ Out v(const In& x, const Params&) { return x; }
};

template <int IN, int OUT, int N, bool HW_FP8> struct ConvertOp {
  using In = Vec<typename KindT<IN>::T, N>;
  using Out = Vec<typename KindT<OUT>::T, N>;
  // One vector of K and of V per thread and step: the conversion sits between each load and
  // its store, so at a few tokens (one warp's chain decides the time) half the work per
  // thread, twice the threads.
  static constexpr int kUnroll = 1;
  static __device__ __forceinline__ Out run(const In& x, float inv, bool scaled, bool exact, bool sat) {
    Out y;
    if constexpr (HW_FP8 && (OUT == E4M3 || OUT == E5M2) && N % 2 == 0) {
      uint16_t pairs[N / 2];  // built as pairs, not bytes: no unpacking and repacking
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        pairs[i / 2] = hw_fp8x2<OUT>(scaled_input<IN>(x.v[i], inv, scaled, exact),
                                     scaled_input<IN>(x.v[i + 1], inv, scaled, exact), sat);
      }
      memcpy(&y, pairs, sizeof(pairs));
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) y.v[i] = convert1<IN, OUT, HW_FP8>(x.v[i], inv, scaled, exact, sat);
    }
    return y;
  }
  static __device__ __forceinline__ Out k(const In& x, const Params& p) {
    return run(x, p.k_inv, p.k_scaled, p.k_exact, p.e4m3_sat);
  }
  static __device__ __forceinline__ Out v(const In& x, const Params& p) {
    return run(x, p.v_inv, p.v_scaled, p.v_exact, p.e4m3_sat);
  }
};

template <class Op>
__global__ void __launch_bounds__(512) store_kv_kernel(const Params p) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  constexpr int kUnroll = Op::kUnroll;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
#endif
  const In* __restrict__ k_in = static_cast<const In*>(p.k_in);
  const In* __restrict__ v_in = static_cast<const In*>(p.v_in);
  Out* __restrict__ k_out = static_cast<Out*>(p.k_out);
  Out* __restrict__ v_out = static_cast<Out*>(p.v_out);
  const int tx = blockDim.x;
  const int nmax = p.nk > p.nv ? p.nk : p.nv;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.y;
  for (long long t = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y; t < p.tokens; t += step) {
    const In* kr = k_in + t * p.k_stride;
    const In* vr = v_in + t * p.v_stride;
    for (int j0 = threadIdx.x; j0 < nmax; j0 += kUnroll * tx) {
      // 1) the row loads, 2) the slot load, all in flight together; 3) the stores
      In kx[kUnroll];
      In vx[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * tx;
        kx[u] = ld_pred(kr + j, j < p.nk);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = j0 + u * tx;
        vx[u] = ld_pred(vr + j, j < p.nv);
      }
      const long long slot = p.loc64 ? ld_pred(static_cast<const long long*>(p.loc) + t, true)
                                     : static_cast<long long>(ld_pred(static_cast<const int*>(p.loc) + t, true));
      if (slot >= 0 && slot < p.rows) {  // never write outside the buffer
        Out* ko = k_out + slot * p.nk;
        Out* vo = v_out + slot * p.nv;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int j = j0 + u * tx;
          if (j < p.nk) ko[j] = Op::k(kx[u], p);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int j = j0 + u * tx;
          if (j < p.nv) vo[j] = Op::v(vx[u], p);
        }
      }
    }
  }
}

struct Launch {
  int threads;
  bool cover_row;  // default shape: grow the block (up to 512) until one step covers a row
  int blocks_per_sm;
  int sms;
  bool pdl;
  cudaStream_t stream;
};

template <class Op>
cudaError_t launch(const Params& p, const Launch& l) {
  const int nmax = p.nk > p.nv ? p.nk : p.nv;
  int tx = 1;
  const int want = (nmax + Op::kUnroll - 1) / Op::kUnroll;
  // A row longer than the block would be walked in sequential steps, each a full memory
  // round trip: at a few tokens that chain is the write's time (32x128 x 1 token, fp8:
  // 2.24 us with 128 threads), so the default shape widens the block to cover it.
  int threads = l.threads;
  if (l.cover_row)
    while (threads < want && threads < 512) threads <<= 1;
  while (tx < want && tx < threads) tx <<= 1;
  const int ty = threads / tx > 0 ? threads / tx : 1;
  long long blocks = (p.tokens + ty - 1) / ty;
  const long long cap = static_cast<long long>(l.blocks_per_sm) * l.sms;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks), 1, 1);
  cfg.blockDim = dim3(tx, ty, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = l.stream;
  cudaLaunchAttribute attr[1];
  if (l.pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, store_kv_kernel<Op>, p);
  }
  store_kv_kernel<Op><<<cfg.gridDim, cfg.blockDim, 0, l.stream>>>(p);
  return cudaGetLastError();
}

template <int IN, int OUT>
cudaError_t dispatch_convert(Params p, const Launch& l, int vec, bool hw_fp8) {
  if constexpr (IN == OUT) {
    return cudaErrorInvalidValue;  // same dtype: the copy path
  } else {
    constexpr int N = 16 / sizeof(typename KindT<IN>::T);  // 16-byte input vectors
    constexpr bool kFp8Out = OUT == E4M3 || OUT == E5M2;
    if (vec == N) {
      p.nk /= N;
      p.nv /= N;
      p.k_stride /= N;
      p.v_stride /= N;
      if constexpr (kFp8Out) {
        if (hw_fp8) return launch<ConvertOp<IN, OUT, N, true>>(p, l);
      }
      return launch<ConvertOp<IN, OUT, N, false>>(p, l);
    }
    if constexpr (kFp8Out) {
      if (hw_fp8) return launch<ConvertOp<IN, OUT, 1, true>>(p, l);
    }
    return launch<ConvertOp<IN, OUT, 1, false>>(p, l);
  }
}

template <int IN>
cudaError_t dispatch_out(int out_kind, const Params& p, const Launch& l, int vec, bool hw_fp8) {
  switch (out_kind) {
    case F32: return dispatch_convert<IN, F32>(p, l, vec, hw_fp8);
    case BF16: return dispatch_convert<IN, BF16>(p, l, vec, hw_fp8);
    case F16: return dispatch_convert<IN, F16>(p, l, vec, hw_fp8);
    case E4M3: return dispatch_convert<IN, E4M3>(p, l, vec, hw_fp8);
    case E5M2: return dispatch_convert<IN, E5M2>(p, l, vec, hw_fp8);
  }
  return cudaErrorInvalidValue;
}

template <typename U>
cudaError_t launch_copy(Params p, const Launch& l, int elem_bytes) {
  // Units of sizeof(U) bytes: row lengths and strides are given in elements.
  const int per = static_cast<int>(sizeof(U)) / elem_bytes;
  p.nk /= per;
  p.nv /= per;
  p.k_stride /= per;
  p.v_stride /= per;
  return launch<CopyOp<U>>(p, l);
}

// A finite power of two (frexp's mantissa is exactly 0.5).
inline bool pow2(float x) {
  int e = 0;
  return std::isfinite(x) && std::frexp(x, &e) == 0.5f;
}

}  // namespace kvprof

// Host entry point, declared in store_kv.cpp with the same signature (a mismatch fails at
// load time, C++ name mangling includes the parameter types). Returns a cudaError_t.
// Row lengths (rk, rv) and input token strides are in elements; `vec_bytes` is the widest
// access (16, 8, 4, 2 or 1 bytes) that every row, stride and base pointer allows.
int kvprof_store_kv_launch(void* k_out, void* v_out, const void* loc, bool loc64, const void* k_in,
                           const void* v_in, long long k_stride, long long v_stride, long long tokens,
                           long long rows, long long rk, long long rv, int in_kind, int out_kind, float k_inv,
                           float v_inv, bool k_scaled, bool v_scaled, int vec_bytes, int threads,
                           bool cover_row, int blocks_per_sm, int sms, bool pdl, bool hw_fp8,
                           cudaStream_t stream) {
  using namespace kvprof;
  if (tokens <= 0) return cudaSuccess;
  Params p{};
  p.k_out = k_out;
  p.v_out = v_out;
  p.loc = loc;
  p.k_in = k_in;
  p.v_in = v_in;
  p.k_stride = k_stride;
  p.v_stride = v_stride;
  p.tokens = tokens;
  p.rows = rows;
  p.nk = static_cast<int>(rk);
  p.nv = static_cast<int>(rv);
  p.k_inv = k_inv;
  p.v_inv = v_inv;
  p.k_scaled = k_scaled;
  p.v_scaled = v_scaled;
  // the round trip through the input dtype is exact for power-of-two scales from bf16/fp32
  // into fp8 (the same rule as triton_fused's _pow2_exact)
  const bool pow2_ok = (in_kind == BF16 || in_kind == F32) && (out_kind == E4M3 || out_kind == E5M2);
  p.k_exact = pow2_ok && k_scaled && pow2(k_inv);
  p.v_exact = pow2_ok && v_scaled && pow2(v_inv);
  p.loc64 = loc64;
  static const bool e4m3_sat = c10::Float8_e4m3fn(470.0f).x == 0x7E;  // this torch's c10 rule
  p.e4m3_sat = e4m3_sat;
  p.pdl = pdl;
  const Launch l{threads, cover_row, blocks_per_sm, sms, pdl, stream};
  static const int kInBytes[5] = {4, 2, 2, 1, 1};
  if (in_kind < 0 || in_kind > 4 || out_kind < 0 || out_kind > 4) return cudaErrorInvalidValue;
  if (in_kind == out_kind) {
    const int eb = kInBytes[in_kind];
    switch (vec_bytes) {
      case 16: return launch_copy<uint4>(p, l, eb);
      case 8: return launch_copy<uint2>(p, l, eb);
      case 4: return launch_copy<uint32_t>(p, l, eb);
      case 2: return eb <= 2 ? launch_copy<uint16_t>(p, l, eb) : cudaErrorInvalidValue;
      case 1: return eb == 1 ? launch_copy<uint8_t>(p, l, eb) : cudaErrorInvalidValue;
      default: return cudaErrorInvalidValue;
    }
  }
  const int vec = vec_bytes == 16 ? 16 / kInBytes[in_kind] : 1;
  switch (in_kind) {
    case F32: return dispatch_out<F32>(out_kind, p, l, vec, hw_fp8);
    case BF16: return dispatch_out<BF16>(out_kind, p, l, vec, hw_fp8);
    case F16: return dispatch_out<F16>(out_kind, p, l, vec, hw_fp8);
    case E4M3: return dispatch_out<E4M3>(out_kind, p, l, vec, hw_fp8);
    case E5M2: return dispatch_out<E5M2>(out_kind, p, l, vec, hw_fp8);
  }
  return cudaErrorInvalidValue;
}
