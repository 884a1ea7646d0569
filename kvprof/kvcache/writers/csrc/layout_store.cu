// kvprof's fused stores for the MLA latent pool and vLLM's paged cache, as plain CUDA launch
// functions (the torch binding is layout_store.cpp).
//
// One flattened grid-stride loop over (token, vector) items: a vector is 16 bytes of input
// (8 bf16/fp16, 4 fp32) where the row lengths, strides and pointers allow it, else one
// element. MLA: a row's first R elements come from nope, the next P from rope, written to
// slot * (R + P); a slot equal to `skip` (SGLang's reserved slot 0) or outside [0, rows) is
// not written. Paged: items cover K then V of each token; slot -1 (padding) and slots past
// the cache are not written. Conversions give torch's / vLLM's bits:
//   MLA fp8:   the hardware round-to-nearest-even saturating cast, fixed up to c10's rule
//              (e5m2 overflow -> inf; e4m3fn overflow -> NaN on torch < 2.12).
//   paged fp8: IEEE fp32 division by the scale read from its device tensor, then the
//              saturating cast (vLLM's __NV_SATFINITE).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

enum Out { SAME = 0, E4M3 = 1, E5M2 = 2 };

template <typename T> __device__ __forceinline__ float widen(T x);
template <> __device__ __forceinline__ float widen<float>(float x) { return x; }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float widen<__half>(__half x) { return __half2float(x); }

// fp32 -> fp8 bits. SAT: overflow and inf give the largest finite value; else c10's rule.
template <int OUT, bool SAT>
__device__ __forceinline__ uint8_t to_fp8(float x) {
  if (OUT == E4M3) {
    uint8_t c = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    if (!SAT) c |= static_cast<uint8_t>(fabsf(x) > 464.0f);  // 0x7E|s -> 0x7F|s (NaN)
    return c;
  }
  uint8_t c = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2));
  if (!SAT) c += static_cast<uint8_t>(fabsf(x) >= 61440.0f);  // 0x7B|s -> 0x7C|s (inf)
  return c;
}

// Convert CH input elements to the output, one vector in, one (narrower) vector out.
template <typename InT, int OUT, bool SAT, bool DIV, int CH>
__device__ __forceinline__ void convert_store(const InT* __restrict__ src, void* dst, float scale) {
  constexpr int IN_BYTES = CH * sizeof(InT);
  constexpr int OUT_BYTES = OUT == SAME ? IN_BYTES : CH;
  union { InT e[CH]; uint4 v16; uint2 v8; uint32_t v4; } in;
  if constexpr (IN_BYTES == 16) in.v16 = *reinterpret_cast<const uint4*>(src);
  else if constexpr (IN_BYTES == 8) in.v8 = *reinterpret_cast<const uint2*>(src);
  else if constexpr (IN_BYTES == 4) in.v4 = *reinterpret_cast<const uint32_t*>(src);
  else {
    for (int i = 0; i < CH; ++i) in.e[i] = src[i];
  }
  if constexpr (OUT == SAME) {
    if constexpr (IN_BYTES == 16) *reinterpret_cast<uint4*>(dst) = in.v16;
    else if constexpr (IN_BYTES == 8) *reinterpret_cast<uint2*>(dst) = in.v8;
    else if constexpr (IN_BYTES == 4) *reinterpret_cast<uint32_t*>(dst) = in.v4;
    else {
      for (int i = 0; i < CH; ++i) reinterpret_cast<InT*>(dst)[i] = in.e[i];
    }
  } else {
    union { uint8_t b[CH]; uint2 v8; uint32_t v4; } out;
    #pragma unroll
    for (int i = 0; i < CH; ++i) {
      float x = widen<InT>(in.e[i]);
      if (DIV) x = __fdiv_rn(x, scale);
      out.b[i] = to_fp8<OUT, SAT>(x);
    }
    if constexpr (OUT_BYTES == 8) *reinterpret_cast<uint2*>(dst) = out.v8;
    else if constexpr (OUT_BYTES == 4) *reinterpret_cast<uint32_t*>(dst) = out.v4;
    else {
      for (int i = 0; i < CH; ++i) reinterpret_cast<uint8_t*>(dst)[i] = out.b[i];
    }
  }
}

template <typename InT, int OUT, bool SAT, int CH, typename LocT>
__global__ void mla_store(void* __restrict__ buf, const LocT* __restrict__ loc, const InT* __restrict__ nope,
                          const InT* __restrict__ rope, int64_t nope_stride, int64_t rope_stride, int64_t tokens,
                          int64_t rows, int64_t skip, int64_t R, int64_t P) {
  constexpr int OUT_ELEM = OUT == SAME ? sizeof(InT) : 1;
  const int64_t nv = (R + P) / CH;
  const int64_t total = tokens * nv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / nv;
    const int64_t c = (i - t * nv) * CH;
    const int64_t slot = static_cast<int64_t>(loc[t]);
    if (slot < 0 || slot >= rows || slot == skip) continue;
    const InT* src = c < R ? nope + t * nope_stride + c : rope + t * rope_stride + (c - R);
    char* dst = static_cast<char*>(buf) + (slot * (R + P) + c) * OUT_ELEM;
    convert_store<InT, OUT, SAT, false, CH>(src, dst, 1.0f);
  }
}

template <typename InT, int OUT, int CH, typename LocT>
__global__ void paged_store(void* __restrict__ k_cache, void* __restrict__ v_cache, const LocT* __restrict__ slots,
                            const InT* __restrict__ key, const InT* __restrict__ value, int64_t k_stride,
                            int64_t v_stride, const float* __restrict__ k_scale, const float* __restrict__ v_scale,
                            int64_t tokens, int64_t num_slots, int64_t row) {
  constexpr int OUT_ELEM = OUT == SAME ? sizeof(InT) : 1;
  const float ks = OUT == SAME ? 1.0f : *k_scale;
  const float vs = OUT == SAME ? 1.0f : *v_scale;
  const int64_t nv = row / CH;  // vectors per K (or V) row
  const int64_t total = tokens * 2 * nv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (2 * nv);
    int64_t v = i - t * 2 * nv;
    const bool is_v = v >= nv;
    const int64_t c = (is_v ? v - nv : v) * CH;
    const int64_t slot = static_cast<int64_t>(slots[t]);
    if (slot < 0 || slot >= num_slots) continue;
    const InT* src = is_v ? value + t * v_stride + c : key + t * k_stride + c;
    char* dst = static_cast<char*>(is_v ? v_cache : k_cache) + (slot * row + c) * OUT_ELEM;
    convert_store<InT, OUT, true, OUT != SAME, CH>(src, dst, is_v ? vs : ks);
  }
}

int grid_for(int64_t items, int threads, int sms) {
  int64_t blocks = (items + threads - 1) / threads;
  int64_t cap = int64_t(sms) * 8;
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

template <typename InT, int OUT, bool SAT, int CH>
void mla_launch_t(void* buf, const void* loc, bool loc64, const void* nope, const void* rope, int64_t ns, int64_t ps,
                  int64_t tokens, int64_t rows, int64_t skip, int64_t R, int64_t P, int sms, cudaStream_t s) {
  const int threads = 256;
  const int grid = grid_for(tokens * ((R + P) / CH), threads, sms);
  if (loc64)
    mla_store<InT, OUT, SAT, CH, int64_t><<<grid, threads, 0, s>>>(buf, static_cast<const int64_t*>(loc),
        static_cast<const InT*>(nope), static_cast<const InT*>(rope), ns, ps, tokens, rows, skip, R, P);
  else
    mla_store<InT, OUT, SAT, CH, int32_t><<<grid, threads, 0, s>>>(buf, static_cast<const int32_t*>(loc),
        static_cast<const InT*>(nope), static_cast<const InT*>(rope), ns, ps, tokens, rows, skip, R, P);
}

template <typename InT, int OUT, int CH>
void paged_launch_t(void* kc, void* vc, const void* slots, bool loc64, const void* key, const void* value,
                    int64_t ks, int64_t vs, const float* kscale, const float* vscale, int64_t tokens,
                    int64_t num_slots, int64_t row, int sms, cudaStream_t s) {
  const int threads = 256;
  const int grid = grid_for(tokens * 2 * (row / CH), threads, sms);
  if (loc64)
    paged_store<InT, OUT, CH, int64_t><<<grid, threads, 0, s>>>(kc, vc, static_cast<const int64_t*>(slots),
        static_cast<const InT*>(key), static_cast<const InT*>(value), ks, vs, kscale, vscale, tokens, num_slots, row);
  else
    paged_store<InT, OUT, CH, int32_t><<<grid, threads, 0, s>>>(kc, vc, static_cast<const int32_t*>(slots),
        static_cast<const InT*>(key), static_cast<const InT*>(value), ks, vs, kscale, vscale, tokens, num_slots, row);
}

}  // namespace

#define KV_MLA(InT, OUT, SAT)                                                                                   \
  do {                                                                                                          \
    constexpr int V = 16 / sizeof(InT);                                                                         \
    if (wide) mla_launch_t<InT, OUT, SAT, V>(buf, loc, loc64, nope, rope, ns, ps, tokens, rows, skip, R, P, sms, s); \
    else mla_launch_t<InT, OUT, SAT, 1>(buf, loc, loc64, nope, rope, ns, ps, tokens, rows, skip, R, P, sms, s); \
  } while (0)

// Returns 0, or -1 for a combination this op has no kernel for.
int kvprof_mla_store_launch(void* buf, const void* loc, bool loc64, const void* nope, const void* rope,
                            long long ns, long long ps, long long tokens, long long rows, long long skip,
                            long long R, long long P, int in_kind, int out, bool e4m3_sat, bool wide, int sms,
                            cudaStream_t s) {
  if (tokens <= 0) return 0;
  switch (in_kind * 3 + out) {
    case 0: KV_MLA(float, SAME, false); break;
    case 3: KV_MLA(__nv_bfloat16, SAME, false); break;
    case 6: KV_MLA(__half, SAME, false); break;
    case 1: if (e4m3_sat) KV_MLA(float, E4M3, true); else KV_MLA(float, E4M3, false); break;
    case 4: if (e4m3_sat) KV_MLA(__nv_bfloat16, E4M3, true); else KV_MLA(__nv_bfloat16, E4M3, false); break;
    case 7: if (e4m3_sat) KV_MLA(__half, E4M3, true); else KV_MLA(__half, E4M3, false); break;
    case 2: KV_MLA(float, E5M2, false); break;
    case 5: KV_MLA(__nv_bfloat16, E5M2, false); break;
    case 8: KV_MLA(__half, E5M2, false); break;
    default: return -1;
  }
  return static_cast<int>(cudaGetLastError());
}

#define KV_PAGED(InT, OUT)                                                                                    \
  do {                                                                                                        \
    constexpr int V = 16 / sizeof(InT);                                                                       \
    if (wide) paged_launch_t<InT, OUT, V>(kc, vc, slots, loc64, key, value, ks, vs, kscale, vscale, tokens,   \
                                          num_slots, row, sms, s);                                            \
    else paged_launch_t<InT, OUT, 1>(kc, vc, slots, loc64, key, value, ks, vs, kscale, vscale, tokens,        \
                                     num_slots, row, sms, s);                                                 \
  } while (0)

int kvprof_paged_store_launch(void* kc, void* vc, const void* slots, bool loc64, const void* key, const void* value,
                              long long ks, long long vs, const float* kscale, const float* vscale,
                              long long tokens, long long num_slots, long long row, int in_kind, int out, bool wide,
                              int sms, cudaStream_t s) {
  if (tokens <= 0) return 0;
  switch (in_kind * 3 + out) {
    case 0: KV_PAGED(float, SAME); break;
    case 3: KV_PAGED(__nv_bfloat16, SAME); break;
    case 6: KV_PAGED(__half, SAME); break;
    case 1: KV_PAGED(float, E4M3); break;
    case 4: KV_PAGED(__nv_bfloat16, E4M3); break;
    case 7: KV_PAGED(__half, E4M3); break;
    case 2: KV_PAGED(float, E5M2); break;
    case 5: KV_PAGED(__nv_bfloat16, E5M2); break;
    case 8: KV_PAGED(__half, E5M2); break;
    default: return -1;
  }
  return static_cast<int>(cudaGetLastError());
}
