// kvprof's launcher of vLLM's own cache kernels (the vllm_* peer writers).
//
// The kernels come from vLLM's source, extracted into a folder of the user's by
// `python -m kvprof.kvcache.writers.vllm_src_extract` (nothing of vLLM is part of kvprof) and
// found through the include path the build adds. Launched as vLLM's host functions
// reshape_and_cache_flash and concat_and_cache_mla launch them: grid = tokens,
// block = min(heads * head_size, 512) / min(kv_lora_rank, 512), the current stream, the same
// template arguments per input and cache dtype (vLLM's DISPATCH_BY_KV_CACHE_DTYPE).

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

#include "vllm_cache_kernels.cuh"

namespace {



// 0: the cache stores the input dtype (vLLM's "auto"), 1: fp8 e4m3, 2: fp8 e5m2
#define KVPROF_DISPATCH(SRC, CODE, FN)                                                            \
  if ((CODE) == 0) {                                                                              \
    if ((SRC) == at::kFloat) { FN(float, float, vllm::Fp8KVCacheDataType::kAuto); }                     \
    else if ((SRC) == at::kHalf) { FN(uint16_t, uint16_t, vllm::Fp8KVCacheDataType::kAuto); }           \
    else { FN(__nv_bfloat16, __nv_bfloat16, vllm::Fp8KVCacheDataType::kAuto); }                         \
  } else if ((CODE) == 1) {                                                                       \
    if ((SRC) == at::kFloat) { FN(float, uint8_t, vllm::Fp8KVCacheDataType::kFp8E4M3); }                \
    else if ((SRC) == at::kHalf) { FN(uint16_t, uint8_t, vllm::Fp8KVCacheDataType::kFp8E4M3); }         \
    else { FN(__nv_bfloat16, uint8_t, vllm::Fp8KVCacheDataType::kFp8E4M3); }                            \
  } else {                                                                                        \
    if ((SRC) == at::kFloat) { FN(float, uint8_t, vllm::Fp8KVCacheDataType::kFp8E5M2); }                \
    else if ((SRC) == at::kHalf) { FN(uint16_t, uint8_t, vllm::Fp8KVCacheDataType::kFp8E5M2); }         \
    else { FN(__nv_bfloat16, uint8_t, vllm::Fp8KVCacheDataType::kFp8E5M2); }                            \
  }

void check(bool ok, const char* what) { TORCH_CHECK(ok, "vllm_peers: ", what); }

void check_common(const at::Tensor& slots, const at::Tensor& src, int64_t code) {
  check(slots.is_cuda() && slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.is_contiguous(),
        "slot_mapping must be a contiguous 1-D int64 CUDA tensor (vLLM's kernels read int64 slots)");
  auto t = src.scalar_type();
  check(t == at::kFloat || t == at::kHalf || t == at::kBFloat16, "inputs must be fp32, fp16 or bf16");
  check(code >= 0 && code <= 2, "cache code must be 0 (auto), 1 (fp8 e4m3) or 2 (fp8 e5m2)");
}

}  // namespace

#define KVPROF_CALL_FLASH(KV_T, CACHE_T, KV_DTYPE)                                                  \
  vllm::reshape_and_cache_flash_kernel<KV_T, CACHE_T, KV_DTYPE><<<grid, block, 0, stream>>>(         \
      reinterpret_cast<KV_T*>(key.data_ptr()), reinterpret_cast<KV_T*>(value.data_ptr()),          \
      reinterpret_cast<CACHE_T*>(key_cache.data_ptr()), reinterpret_cast<CACHE_T*>(value_cache.data_ptr()), \
      slots.data_ptr<int64_t>(), block_stride, page_stride, head_stride, key_stride, value_stride,  \
      num_heads, head_size, block_size, ks, vs, 0);

void reshape_and_cache_flash(at::Tensor key, at::Tensor value, at::Tensor key_cache, at::Tensor value_cache,
                             at::Tensor slots, int64_t code, c10::optional<at::Tensor> k_scale,
                             c10::optional<at::Tensor> v_scale) {
  check_common(slots, key, code);
  check(key.dim() == 3 && value.dim() == 3 && key_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes(),
        "key/value [tokens, heads, head_size], caches [blocks, block_size, heads, head_size]");
  check(key.stride(2) == 1 && key.stride(1) == key.size(2) && value.stride(2) == 1 && value.stride(1) == value.size(2),
        "key/value rows must be contiguous");
  check(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  check(code == 0 || (k_scale.has_value() && v_scale.has_value()), "an fp8 cache needs k_scale and v_scale");
  int num_tokens = slots.size(0);
  if (num_tokens == 0) return;
  int num_heads = key.size(1), head_size = key.size(2), block_size = key_cache.size(1);
  int64_t key_stride = key.stride(0), value_stride = value.stride(0);
  int64_t block_stride = key_cache.stride(0), page_stride = key_cache.stride(1), head_stride = key_cache.stride(2);
  const float* ks = code ? k_scale->data_ptr<float>() : nullptr;
  const float* vs = code ? v_scale->data_ptr<float>() : nullptr;
  const c10::cuda::CUDAGuard guard(key.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  dim3 grid(num_tokens);
  dim3 block(std::min(num_heads * head_size, 512));
  KVPROF_DISPATCH(key.scalar_type(), code, KVPROF_CALL_FLASH);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define KVPROF_CALL_MLA(KV_T, CACHE_T, KV_DTYPE)                                                    \
  if (skip < 0) {                                                                                   \
    vllm::concat_and_cache_mla_kernel<KV_T, CACHE_T, KV_DTYPE><<<grid, block, 0, stream>>>(         \
        reinterpret_cast<KV_T*>(kv_c.data_ptr()), reinterpret_cast<KV_T*>(k_pe.data_ptr()),         \
        reinterpret_cast<CACHE_T*>(kv_cache.data_ptr()), slots.data_ptr<int64_t>(), block_stride,  \
        entry_stride, kv_c_stride, k_pe_stride, kv_lora_rank, pe_dim, block_size, sc);              \
  } else {                                                                                          \
    vllm::concat_and_cache_mla_skip_kernel<KV_T, CACHE_T, KV_DTYPE><<<grid, block, 0, stream>>>(    \
        reinterpret_cast<KV_T*>(kv_c.data_ptr()), reinterpret_cast<KV_T*>(k_pe.data_ptr()),         \
        reinterpret_cast<CACHE_T*>(kv_cache.data_ptr()), slots.data_ptr<int64_t>(), block_stride,  \
        entry_stride, kv_c_stride, k_pe_stride, kv_lora_rank, pe_dim, block_size, sc, skip);        \
  }

void concat_and_cache_mla(at::Tensor kv_c, at::Tensor k_pe, at::Tensor kv_cache, at::Tensor slots, int64_t code,
                          c10::optional<at::Tensor> scale, int64_t skip) {
  check_common(slots, kv_c, code);
  check(kv_c.dim() == 2 && k_pe.dim() == 2 && kv_cache.dim() == 3 && kv_c.stride(1) == 1 && k_pe.stride(1) == 1,
        "kv_c [tokens, kv_lora_rank], k_pe [tokens, pe_dim] with contiguous rows, kv_cache [blocks, block_size, D]");
  check(kv_cache.size(2) == kv_c.size(1) + k_pe.size(1) && kv_cache.stride(2) == 1, "kv_cache rows must be kv_lora_rank + pe_dim");
  check(code == 0 || scale.has_value(), "an fp8 cache needs a scale");
  int num_tokens = slots.size(0);
  if (num_tokens == 0) return;
  int kv_lora_rank = kv_c.size(1), pe_dim = k_pe.size(1), block_size = kv_cache.size(1);
  int kv_c_stride = kv_c.stride(0), k_pe_stride = k_pe.stride(0);
  int block_stride = kv_cache.stride(0), entry_stride = kv_cache.stride(1);
  const float* sc = code ? scale->data_ptr<float>() : nullptr;
  const c10::cuda::CUDAGuard guard(kv_c.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  dim3 grid(num_tokens);
  dim3 block(std::min(kv_lora_rank, 512));
  KVPROF_DISPATCH(kv_c.scalar_type(), code, KVPROF_CALL_MLA);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("reshape_and_cache_flash", &reshape_and_cache_flash, "vLLM's reshape_and_cache_flash_kernel");
  m.def("concat_and_cache_mla", &concat_and_cache_mla, "vLLM's concat_and_cache_mla_kernel (skip < 0: verbatim)");
}
