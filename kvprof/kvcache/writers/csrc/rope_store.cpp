// Torch binding of kvprof's rope + K/V store (kernel in rope_store.cu).
//
// A plain pybind function, as store_kv.cpp: one Python -> C++ call straight into the launch.
// It checks what the kernel relies on (cheap checks, no device sync), picks the widest vector
// the rows, strides and pointers allow, and launches on the current stream.

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Float8_e4m3fn.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>

#include "rope_store.h"

namespace {

using kvprof_rope::BF16;
using kvprof_rope::E4M3;
using kvprof_rope::E5M2;
using kvprof_rope::F16;

int in_kind_of(at::ScalarType t) {
  if (t == at::kBFloat16) return BF16;
  if (t == at::kHalf) return F16;
  return -1;
}

bool aligned(const void* p, int64_t n) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(n) == 0; }

struct DeviceFacts {
  int sms = 0;
  int major = 0;
};

// SM count and compute capability major per device, asked once (the grid cap; PDL needs sm_90+).
const DeviceFacts& device_facts(int device) {
  static std::array<DeviceFacts, 64> cache{};
  static const DeviceFacts fallback{132, 0};
  if (device < 0 || device >= static_cast<int>(cache.size())) return fallback;
  DeviceFacts& f = cache[device];
  if (f.sms == 0) {
    int n = 0, major = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 132;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) major = 0;
    f.major = major;
    f.sms = n;
  }
  return f;
}

// The default launch shape (one place): 128 threads per block up to 512 tokens, 256 above,
// the grid capped at 8 blocks per SM (a grid-stride loop does the rest).
constexpr int kDefaultBlocksPerSm = 8;
int default_threads(int64_t tokens) { return tokens <= 512 ? 128 : 256; }

// The rows of one token, and the tokens, never overlap (each thread rotates its own
// elements in place; an expanded tensor would race).
bool rows_apart(const at::Tensor& t) {
  const int64_t heads = t.size(1), dim = t.size(2);
  if (heads > 1 && t.stride(1) < dim) return false;
  return t.size(0) <= 1 || t.stride(0) >= (heads - 1) * t.stride(1) + dim;
}

}  // namespace

// q [T, Hq, D] and k [T, Hk, D] are rotated in place (q bf16 or fp16 of its own), v [T, Hk, Dv]
// has k's dtype; k_out/v_out are the pool's contiguous rows ([rows, Hk, D] / [rows, Hk, Dv],
// uint8 or fp8 storage for fp8 caches); loc and positions [T] int32/int64 (any stride);
// cos_sin [max_pos, rope_dim] float32.
// `flags`: bits 0-2 the cache's kind (1 bf16, 2 fp16, 3 fp8 e4m3fn, 4 fp8 e5m2), bit 3 k
// scaled, bit 4 v scaled, bit 5 pdl, bit 6 GPT-NeoX (else GPT-J), bit 7 pdl where the device
// has it (sm_90+; overrides bit 5), bits 8-11 log2(threads per block), bits 12-19 blocks per SM
// (both 0: the default shape above).
void rope_store(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_out,
                const at::Tensor& v_out, const at::Tensor& loc, const at::Tensor& positions, const at::Tensor& cos_sin,
                double k_inv, double v_inv, int64_t flags) {
  const int out_kind = static_cast<int>(flags & 7);
  const bool neox = (flags >> 6) & 1, pdl_auto = (flags >> 7) & 1;
  const bool forced_shape = ((flags >> 8) & 0xFFF) != 0;
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && k_out.is_cuda() && v_out.is_cuda() && loc.is_cuda() &&
                  positions.is_cuda() && cos_sin.is_cuda(),
              "rope_cuda_fused: all tensors must be CUDA tensors");
  const int device = q.get_device();
  for (const at::Tensor* t : {&k, &v, &k_out, &v_out, &loc, &positions, &cos_sin}) {
    TORCH_CHECK(t->get_device() == device, "rope_cuda_fused: all tensors must be on one device");
  }
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "rope_cuda_fused: q, k, v must be [tokens, heads, dim]");
  const int64_t tokens = q.size(0);
  TORCH_CHECK(k.size(0) == tokens && v.size(0) == tokens, "rope_cuda_fused: q, k, v differ in tokens");
  TORCH_CHECK(loc.dim() == 1 && loc.size(0) == tokens &&
                  (loc.scalar_type() == at::kInt || loc.scalar_type() == at::kLong),
              "rope_cuda_fused: loc must be a 1-D int32 or int64 tensor of one slot per token");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == tokens &&
                  (positions.scalar_type() == at::kInt || positions.scalar_type() == at::kLong),
              "rope_cuda_fused: positions must be a 1-D int32 or int64 tensor of one position per token");
  const int64_t hq = q.size(1), hk = k.size(1), dim = q.size(2), v_dim = v.size(2);
  TORCH_CHECK(k.size(2) == dim, "rope_cuda_fused: q and k differ in head dim");
  TORCH_CHECK(v.size(1) == hk, "rope_cuda_fused: k and v differ in heads");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "rope_cuda_fused: q, k, v rows must be contiguous in their last dim");
  TORCH_CHECK(rows_apart(q) && rows_apart(k),
              "rope_cuda_fused: q and k rows must not overlap (they are rotated in place)");
  const int in_kind = in_kind_of(k.scalar_type()), q_kind = in_kind_of(q.scalar_type());
  TORCH_CHECK(in_kind > 0 && q_kind > 0, std::string("rope_cuda_fused: q, k, v must be bf16 or fp16, not ") +
                                              c10::toString(q.scalar_type()) + " and " + c10::toString(k.scalar_type()));
  TORCH_CHECK(v.scalar_type() == k.scalar_type(), "rope_cuda_fused: k and v differ in dtype");
  const bool fp8 = out_kind == E4M3 || out_kind == E5M2;
  TORCH_CHECK(fp8 || out_kind == in_kind, "rope_cuda_fused: the cache must have the input's dtype or be fp8");
  const at::ScalarType fp8_type = out_kind == E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  for (const at::Tensor* t : {&k_out, &v_out}) {
    const at::ScalarType s = t->scalar_type();
    TORCH_CHECK(fp8 ? (s == at::kByte || s == fp8_type) : s == k.scalar_type(),
                std::string("rope_cuda_fused: cache buffers must be the cache's dtype (uint8 storage for fp8), not ") +
                    c10::toString(s));
  }
  TORCH_CHECK(k_out.is_contiguous() && v_out.is_contiguous() && k_out.dim() >= 1 && v_out.dim() >= 1,
              "rope_cuda_fused: cache buffers must be contiguous");
  const int64_t rows = k_out.size(0);
  TORCH_CHECK(v_out.size(0) == rows, "rope_cuda_fused: k and v buffers differ in rows");
  TORCH_CHECK(rows == 0 || (k_out.numel() / rows == hk * dim && v_out.numel() / rows == hk * v_dim),
              "rope_cuda_fused: cache rows must hold heads x dim of k and of v");
  TORCH_CHECK(cos_sin.dim() == 2 && cos_sin.scalar_type() == at::kFloat && cos_sin.stride(1) == 1,
              "rope_cuda_fused: cos_sin_cache must be a float32 [max_position, rope_dim] tensor with contiguous rows");
  const int64_t rope_dim = cos_sin.size(1);
  TORCH_CHECK(rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= dim,
              "rope_cuda_fused: rope_dim (cos_sin_cache's last dim) must be even and at most the head dim");
  TORCH_CHECK(out_kind >= BF16 && out_kind <= E5M2,
              std::string("rope_cuda_fused: unsupported cache kind ") + std::to_string(out_kind));
  const int64_t threads = forced_shape ? int64_t{1} << ((flags >> 8) & 15) : default_threads(tokens);
  const int64_t blocks_per_sm = forced_shape ? (flags >> 12) & 255 : kDefaultBlocksPerSm;
  TORCH_CHECK(threads >= 32 && threads <= 512, "rope_cuda_fused: threads must be a power of two in [32, 512]");
  TORCH_CHECK(blocks_per_sm >= 1, "rope_cuda_fused: blocks_per_sm must be >= 1");
  if (tokens == 0) return;  // every check passed: launch nothing

  // The widest vector (8 or 2 elements) that every length, stride and pointer allows.
  const int out_bytes = fp8 ? 1 : 2;
  // floats per cos/sin load in the kernel (load_floats): a NeoX item reads n of each, a GPT-J item n/2
  auto cos_floats = [&](int64_t n) -> int64_t {
    const int64_t m = neox ? n : n / 2;
    return m % 4 == 0 ? 4 : (m % 2 == 0 ? 2 : 1);
  };
  auto fits = [&](int64_t n) {
    const int64_t in_align = n * 2, out_align = n * out_bytes;
    if (dim % n || v_dim % n) return false;
    for (const at::Tensor* t : {&q, &k, &v}) {  // the stride of a dim of size 1 is never used
      for (int d : {0, 1}) {
        if (t->size(d) > 1 && t->stride(d) % n) return false;
      }
    }
    return rope_dim % (neox ? 2 * n : n) == 0 && aligned(q.data_ptr(), in_align) && aligned(k.data_ptr(), in_align) &&
           aligned(v.data_ptr(), in_align) && aligned(k_out.data_ptr(), out_align) &&
           aligned(v_out.data_ptr(), out_align) && aligned(cos_sin.data_ptr(), 4 * cos_floats(n)) &&
           (cos_sin.size(0) <= 1 || cos_sin.stride(0) % cos_floats(n) == 0);
  };
  const int vec = fits(8) ? 8 : (fits(2) ? 2 : 0);
  TORCH_CHECK(vec > 0, neox ? "rope_cuda_fused: needs even head dims and strides, 4-byte aligned rows and rope_dim "
                              "a multiple of 4"
                            : "rope_cuda_fused: needs even head dims and strides, 4-byte aligned rows and rope_dim "
                              "a multiple of 2");

  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const DeviceFacts& facts = device_facts(device);
  kvprof_rope::RopeStoreArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.k_out = k_out.data_ptr();
  a.v_out = v_out.data_ptr();
  a.loc = loc.data_ptr();
  a.pos = positions.data_ptr();
  a.cos_sin = cos_sin.data_ptr<float>();
  a.q_tok = q.stride(0);
  a.q_head = q.stride(1);
  a.k_tok = k.stride(0);
  a.k_head = k.stride(1);
  a.v_tok = v.stride(0);
  a.v_head = v.stride(1);
  a.loc_stride = loc.stride(0);
  a.pos_stride = positions.stride(0);
  a.cs_stride = cos_sin.stride(0);
  a.tokens = tokens;
  a.rows = rows;
  a.max_pos = cos_sin.size(0);
  a.hq = static_cast<int>(hq);
  a.hk = static_cast<int>(hk);
  a.dim = static_cast<int>(dim);
  a.v_dim = static_cast<int>(v_dim);
  a.rope_dim = static_cast<int>(rope_dim);
  a.q_kind = q_kind;
  a.in_kind = in_kind;
  a.out_kind = out_kind;
  a.neox = neox;
  a.loc64 = loc.scalar_type() == at::kLong;
  a.pos64 = positions.scalar_type() == at::kLong;
  a.k_inv = static_cast<float>(k_inv);
  a.v_inv = static_cast<float>(v_inv);
  a.k_scaled = (flags >> 3) & 1;
  a.v_scaled = (flags >> 4) & 1;
  static const bool e4m3_sat = c10::Float8_e4m3fn(470.0f).x == 0x7E;  // this torch's c10 rule
  a.e4m3_sat = e4m3_sat;
  a.vec = vec;
  a.threads = static_cast<int>(threads);
  a.blocks_per_sm = static_cast<int>(blocks_per_sm);
  a.sms = facts.sms;
  a.pdl = pdl_auto ? facts.major >= 9 : ((flags >> 5) & 1) != 0;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  const int err = kvprof_rope::rope_store_launch(a, stream);
  TORCH_CHECK(err == cudaSuccess, "rope_cuda_fused: launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kvprof rope + K/V cache store";
  m.def("rope_store", &rope_store,
        "rope_store(q, k, v, k_out, v_out, loc, positions, cos_sin, k_inv, v_inv, flags): rotate q, k in place, "
        "store k and v at loc");
}
