// Torch binding of kvprof's fused MLA and paged stores (kernels in layout_store.cu).
//
// Plain pybind functions: the eager launch path is why this op exists next to the Triton
// writers. Cheap checks only (no device sync); the pools have validated the call already.
// Picks 16-byte vectors where the row parts, strides and pointers allow, else elements.

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstdint>

int kvprof_mla_store_launch(void* buf, const void* loc, bool loc64, const void* nope, const void* rope,
                            long long ns, long long ps, long long tokens, long long rows, long long skip,
                            long long R, long long P, int in_kind, int out, bool e4m3_sat, bool wide, int sms,
                            cudaStream_t s);
int kvprof_paged_store_launch(void* kc, void* vc, const void* slots, bool loc64, const void* key, const void* value,
                              long long ks, long long vs, const float* kscale, const float* vscale,
                              long long tokens, long long num_slots, long long row, int in_kind, int out, bool wide,
                              int sms, cudaStream_t s);

namespace {

int in_kind_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    default: return -1;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int sms_of(int device) {
  static int cache[64] = {0};
  if (device < 0 || device >= 64) return 132;
  if (cache[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 132;
    cache[device] = n;
  }
  return cache[device];
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "layout_store: ", name, " must be on CUDA");
  TORCH_CHECK(t.stride(-1) == 1, "layout_store: ", name, " rows must be contiguous");
}

// out: 0 same dtype, 1 e4m3fn, 2 e5m2
void mla_store(at::Tensor buf, at::Tensor loc, at::Tensor nope, at::Tensor rope, int64_t skip, int64_t out,
               bool e4m3_sat) {
  const int64_t tokens = loc.size(0);
  if (tokens == 0) return;
  check_rows(nope, "nope");
  check_rows(rope, "rope");
  TORCH_CHECK(buf.is_cuda() && buf.is_contiguous(), "layout_store: the MLA buffer must be a contiguous CUDA tensor");
  TORCH_CHECK(loc.is_cuda() && (loc.scalar_type() == at::kLong || loc.scalar_type() == at::kInt),
              "layout_store: loc must be int32/int64 on CUDA");
  TORCH_CHECK(loc.dim() == 1 && (loc.stride(0) == 1 || tokens == 1),
              "layout_store: loc must be 1-D and contiguous (the kernel reads consecutive slots)");
  const int kind = in_kind_of(nope.scalar_type());
  TORCH_CHECK(kind >= 0 && rope.scalar_type() == nope.scalar_type(), "layout_store: nope/rope must be fp32/bf16/fp16");
  const int64_t R = nope.size(-1), P = rope.size(-1), rows = buf.size(0);
  TORCH_CHECK(buf.numel() == rows * (R + P), "layout_store: buffer rows are not nope + rope wide");
  const int64_t V = 16 / nope.element_size();
  const bool wide = R % V == 0 && P % V == 0 && nope.stride(0) % V == 0 && rope.stride(0) % V == 0 &&
                    aligned16(nope.data_ptr()) && aligned16(rope.data_ptr()) && aligned16(buf.data_ptr());
  const c10::cuda::CUDAGuard guard(buf.device());
  const int rc = kvprof_mla_store_launch(buf.data_ptr(), loc.data_ptr(), loc.scalar_type() == at::kLong,
                                         nope.data_ptr(), rope.data_ptr(), nope.stride(0), rope.stride(0), tokens,
                                         rows, skip, R, P, kind, static_cast<int>(out), e4m3_sat, wide,
                                         sms_of(buf.get_device()), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(rc == 0, "layout_store: MLA launch failed (", rc == -1 ? "no kernel for these dtypes" : cudaGetErrorString(static_cast<cudaError_t>(rc)), ")");
}

void paged_store(at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots, at::Tensor key, at::Tensor value,
                 c10::optional<at::Tensor> k_scale, c10::optional<at::Tensor> v_scale, int64_t out) {
  const int64_t tokens = slots.size(0);
  if (tokens == 0) return;
  check_rows(key, "key");
  check_rows(value, "value");
  TORCH_CHECK(k_cache.is_cuda() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "layout_store: the caches must be contiguous CUDA tensors");
  TORCH_CHECK(slots.is_cuda() && (slots.scalar_type() == at::kLong || slots.scalar_type() == at::kInt),
              "layout_store: slot_mapping must be int32/int64 on CUDA");
  TORCH_CHECK(slots.dim() == 1 && (slots.stride(0) == 1 || tokens == 1),
              "layout_store: slot_mapping must be 1-D and contiguous (the kernel reads consecutive slots)");
  const int kind = in_kind_of(key.scalar_type());
  TORCH_CHECK(kind >= 0 && value.scalar_type() == key.scalar_type(), "layout_store: key/value must be fp32/bf16/fp16");
  const int64_t row = k_cache.size(2) * k_cache.size(3);
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  TORCH_CHECK(key.dim() == 3 && key.size(1) * key.size(2) == row && (key.size(1) == 1 || key.stride(1) == key.size(2)),
              "layout_store: key rows do not match the cache");
  const float* ks = nullptr;
  const float* vs = nullptr;
  if (out != 0) {
    TORCH_CHECK(k_scale.has_value() && v_scale.has_value() && k_scale->scalar_type() == at::kFloat &&
                v_scale->scalar_type() == at::kFloat && k_scale->is_cuda() && v_scale->is_cuda(),
                "layout_store: fp8 caches need fp32 k_scale/v_scale tensors on CUDA");
    ks = k_scale->data_ptr<float>();
    vs = v_scale->data_ptr<float>();
  }
  const int64_t V = 16 / key.element_size();
  const bool wide = row % V == 0 && key.stride(0) % V == 0 && value.stride(0) % V == 0 && aligned16(key.data_ptr()) &&
                    aligned16(value.data_ptr()) && aligned16(k_cache.data_ptr()) && aligned16(v_cache.data_ptr());
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const int rc = kvprof_paged_store_launch(k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                           slots.scalar_type() == at::kLong, key.data_ptr(), value.data_ptr(),
                                           key.stride(0), value.stride(0), ks, vs, tokens, num_slots, row, kind,
                                           static_cast<int>(out), wide, sms_of(k_cache.get_device()),
                                           c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(rc == 0, "layout_store: paged launch failed (", rc == -1 ? "no kernel for these dtypes" : cudaGetErrorString(static_cast<cudaError_t>(rc)), ")");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mla_store", &mla_store, "kvprof's fused MLA latent-row store");
  m.def("paged_store", &paged_store, "kvprof's fused store into vLLM's paged cache");
}
