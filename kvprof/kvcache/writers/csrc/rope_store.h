// The launch arguments of kvprof's rope + K/V store (rope_store.cu), shared by the torch
// binding (rope_store.cpp) and the kernel's launcher. Plain C++ types only: the .cu needs no
// torch header.
#pragma once

#include <cuda_runtime.h>

namespace kvprof_rope {

// Element kinds, numbered as in store_kv.cu / kvprof/kvcache/writers/triton_fused.py (0 is fp32, which
// this op does not take).
enum Kind : int { BF16 = 1, F16 = 2, E4M3 = 3, E5M2 = 4 };

struct RopeStoreArgs {
  void* q;            // [tokens, hq, dim], rotated in place
  void* k;            // [tokens, hk, dim], rotated in place
  const void* v;      // [tokens, hk, v_dim]
  void* k_out;        // the pool's K rows, contiguous [rows, hk, dim] (uint8 storage for fp8)
  void* v_out;        // the pool's V rows, contiguous [rows, hk, v_dim]
  const void* loc;    // [tokens] int32/int64, any stride
  const void* pos;    // [tokens] int32/int64, any stride
  const float* cos_sin;  // [max_pos, rope_dim] float32, rows contiguous: cos half, then sin half
  long long q_tok, q_head, k_tok, k_head, v_tok, v_head;  // strides, in elements
  long long loc_stride, pos_stride, cs_stride;           // in elements
  long long tokens, rows, max_pos;
  int hq, hk, dim, v_dim, rope_dim;
  int q_kind, in_kind, out_kind;  // q, k/v (BF16 or F16) and the cache (in_kind, E4M3 or E5M2)
  bool neox;
  bool loc64, pos64;
  float k_inv, v_inv;  // fp32(1 / scale), used when k_scaled / v_scaled
  bool k_scaled, v_scaled;
  bool e4m3_sat;  // this torch's c10 rule: e4m3 overflow saturates to 448 (else NaN)
  int vec;        // elements per vector: 8 (16-byte rows, strides and pointers) or 2
  int threads, blocks_per_sm, sms;
  bool pdl;
};

// Launches on `stream`; returns a cudaError_t (cudaErrorInvalidValue for arguments it cannot take).
int rope_store_launch(const RopeStoreArgs& a, cudaStream_t stream);

}  // namespace kvprof_rope
