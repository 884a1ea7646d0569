// Torch binding of kvprof's fused K+V store (kernels in store_kv.cu).
//
// A plain pybind function, not a dispatcher op: the point of this writer is the host
// launch path, and a pybind call with tensor arguments is the cheapest way in from Python.
// It checks what the kernel relies on (cheap checks only, no device sync), picks the widest
// vector access the rows, strides and pointers allow, and launches on the current stream.

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>

// Defined in store_kv.cu (same signature; a mismatch is an undefined symbol at load time).
int kvprof_store_kv_launch(void* k_out, void* v_out, const void* loc, bool loc64, const void* k_in,
                           const void* v_in, long long k_stride, long long v_stride, long long tokens,
                           long long rows, long long rk, long long rv, int in_kind, int out_kind, float k_inv,
                           float v_inv, bool k_scaled, bool v_scaled, int vec_bytes, int threads,
                           bool cover_row, int blocks_per_sm, int sms, bool pdl, bool hw_fp8,
                           cudaStream_t stream);

namespace {

int kind_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    case at::kFloat8_e4m3fn: return 3;
    case at::kFloat8_e5m2: return 4;
    default: return -1;
  }
}

int elem_bytes(int kind) { return kind == 0 ? 4 : (kind <= 2 ? 2 : 1); }

bool aligned(const void* p, int64_t n) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(n) == 0; }

// SM count and compute capability major per device, asked once (the grid is capped at
// blocks_per_sm * SMs; programmatic dependent launch needs sm_90+).
struct DeviceFacts {
  int sms = 0;
  int major = 0;
};

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

// The default launch shape when the caller forces none (one place; measured on an H200 with
// gpu/tune_fused.py): 128 threads per block up to 512 tokens, 256 above, 8 blocks per SM,
// and wider blocks (up to 512 threads) where a row needs more threads than that to be
// covered in one step (store_kv.cu, launch).
constexpr int64_t kDefaultBlocksPerSm = 8;
int64_t default_threads(int64_t tokens) { return tokens <= 512 ? 128 : 256; }

// Elements per row of a [n, ...] tensor.
int64_t row_elems(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// Whether an input's rows have the cache's row shape: the same dims after dim 0, or one dim
// of the same number of elements.
bool rows_like_cache(const at::Tensor& in, const at::Tensor& cache) {
  if (in.dim() == 2) return in.size(1) == row_elems(cache);
  if (in.dim() != cache.dim()) return false;
  for (int64_t d = 1; d < in.dim(); ++d) {
    if (in.size(d) != cache.size(d)) return false;
  }
  return true;
}

// Whether everything after dim 0 is one contiguous row (dim 0 may have any stride).
bool rows_contiguous(const at::Tensor& t) {
  int64_t expect = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expect) return false;
    expect *= t.size(d);
  }
  return true;
}

// Whether the bytes `t` can touch meet those of `buf` (contiguous): torch strides are never
// negative, so t's bytes run from its first one to the end of its last element.
bool shares_bytes(const at::Tensor& t, const at::Tensor& buf) {
  if (t.numel() == 0 || buf.numel() == 0) return false;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto lo = reinterpret_cast<uintptr_t>(t.data_ptr());
  const auto hi = lo + static_cast<uintptr_t>((last + 1) * t.element_size());
  const auto buf_lo = reinterpret_cast<uintptr_t>(buf.data_ptr());
  const auto buf_hi = buf_lo + static_cast<uintptr_t>(buf.numel() * buf.element_size());
  return lo < buf_hi && buf_lo < hi;
}

}  // namespace

// k_out/v_out: the pool's storage buffers (uint8 for fp8 caches), contiguous, [rows, ...].
// k_in/v_in: [tokens, ...] with contiguous rows (any token stride). `flags` packs the small
// arguments (fewer Python -> C++ conversions on the hot path):
//   bits 0-2 the cache's logical dtype (0 fp32, 1 bf16, 2 fp16, 3 fp8 e4m3fn, 4 fp8 e5m2),
//   bit 3 k_scaled, bit 4 v_scaled, bit 5 pdl, bit 6 hardware fp8 conversion,
//   bit 7 pdl where the device has it (sm_90+; overrides bit 5),
//   bits 8-11 log2(threads per block), bits 12-19 blocks per SM (grid cap); both 0: the
//   default launch shape above.
void store_kv(const at::Tensor& k_out, const at::Tensor& v_out, const at::Tensor& loc, const at::Tensor& k_in,
              const at::Tensor& v_in, double k_inv, double v_inv, int64_t flags) {
  const int64_t tokens = loc.dim() == 1 ? loc.size(0) : -1;
  const int64_t out_kind = flags & 7;
  const bool k_scaled = (flags >> 3) & 1, v_scaled = (flags >> 4) & 1;
  const bool hw_fp8 = (flags >> 6) & 1, pdl_auto = (flags >> 7) & 1;
  const bool forced_shape = ((flags >> 8) & 0xFFF) != 0;
  const int64_t threads = forced_shape ? int64_t{1} << ((flags >> 8) & 15) : default_threads(tokens);
  const int64_t blocks_per_sm = forced_shape ? (flags >> 12) & 255 : kDefaultBlocksPerSm;
  TORCH_CHECK(k_out.is_cuda() && v_out.is_cuda() && loc.is_cuda() && k_in.is_cuda() && v_in.is_cuda(),
              "cuda_fused: all tensors must be CUDA tensors");
  const int device = k_out.get_device();
  TORCH_CHECK(v_out.get_device() == device && loc.get_device() == device && k_in.get_device() == device &&
                  v_in.get_device() == device,
              "cuda_fused: all tensors must be on one device");
  TORCH_CHECK(loc.dim() == 1 && (loc.scalar_type() == at::kInt || loc.scalar_type() == at::kLong),
              "cuda_fused: loc must be a 1-D int32 or int64 tensor");
  TORCH_CHECK(loc.stride(0) == 1 || tokens == 1, "cuda_fused: loc must be contiguous");
  TORCH_CHECK(k_out.is_contiguous() && v_out.is_contiguous(), "cuda_fused: cache buffers must be contiguous");
  TORCH_CHECK(k_in.dim() >= 2 && v_in.dim() >= 2 && k_in.size(0) == tokens && v_in.size(0) == tokens,
              "cuda_fused: k/v inputs must be [tokens, ...]");
  // Exactly the pool's row shapes ([tokens, heads, dim] or [tokens, heads * dim]), so that the
  // pool can leave its Python checks to this op (KVWriter.validates_inputs).
  TORCH_CHECK(rows_like_cache(k_in, k_out) && rows_like_cache(v_in, v_out),
              "cuda_fused: k/v inputs must be [tokens, heads, dim] or [tokens, heads * dim] of the cache's rows");
  TORCH_CHECK(rows_contiguous(k_in) && rows_contiguous(v_in), "cuda_fused: input rows must be contiguous");
  TORCH_CHECK(k_in.scalar_type() == v_in.scalar_type(), "cuda_fused: k and v inputs differ in dtype");
  TORCH_CHECK(k_out.scalar_type() == v_out.scalar_type(), "cuda_fused: k and v buffers differ in dtype");
  TORCH_CHECK(k_out.size(0) == v_out.size(0), "cuda_fused: k and v buffers differ in rows");
  // An input that shares memory with a buffer would be read while it is overwritten.
  TORCH_CHECK(!shares_bytes(k_in, k_out) && !shares_bytes(k_in, v_out) && !shares_bytes(v_in, k_out) &&
                  !shares_bytes(v_in, v_out) && !shares_bytes(loc, k_out) && !shares_bytes(loc, v_out),
              "cuda_fused: an input shares memory with a cache buffer");
  TORCH_CHECK(threads >= 32 && threads <= 512 && (threads & (threads - 1)) == 0,
              "cuda_fused: threads must be a power of two in [32, 512]");
  TORCH_CHECK(blocks_per_sm >= 1, "cuda_fused: blocks_per_sm must be >= 1");
  const int in_kind = kind_of(k_in.scalar_type());
  TORCH_CHECK(in_kind >= 0, std::string("cuda_fused: unsupported input dtype ") + c10::toString(k_in.scalar_type()));
  TORCH_CHECK(out_kind >= 0 && out_kind <= 4,
              std::string("cuda_fused: unsupported cache kind ") + std::to_string(out_kind));
  const int out_bytes = elem_bytes(static_cast<int>(out_kind));
  TORCH_CHECK(k_out.element_size() == out_bytes, "cuda_fused: cache buffer element size does not match its kind");
  const int64_t rk = row_elems(k_out), rv = row_elems(v_out);
  TORCH_CHECK(row_elems(k_in) == rk && row_elems(v_in) == rv, "cuda_fused: input rows do not match the cache rows");
  const int in_bytes = elem_bytes(in_kind);
  const bool copy = in_kind == out_kind;
  TORCH_CHECK(!copy || in_bytes == out_bytes, "cuda_fused: internal error (copy of different widths)");
  if (tokens == 0) return;  // every check passed: launch nothing

  const void* kp = k_in.data_ptr();
  const void* vp = v_in.data_ptr();
  void* ko = k_out.data_ptr();
  void* vo = v_out.data_ptr();
  const int64_t ks = k_in.stride(0), vs = v_in.stride(0);
  int vec_bytes = 1;
  if (copy) {
    // widest unit that divides every row, stride and pointer (in bytes)
    for (int w : {16, 8, 4, 2, 1}) {
      if (w < in_bytes) break;
      const int64_t per = w / in_bytes;
      if (rk % per == 0 && rv % per == 0 && ks % per == 0 && vs % per == 0 && aligned(kp, w) && aligned(vp, w) &&
          aligned(ko, w) && aligned(vo, w)) {
        vec_bytes = w;
        break;
      }
    }
    if (vec_bytes < in_bytes) vec_bytes = in_bytes;
  } else {
    const int64_t n = 16 / in_bytes;  // elements per 16-byte input vector
    if (rk % n == 0 && rv % n == 0 && ks % n == 0 && vs % n == 0 && aligned(kp, 16) && aligned(vp, 16) &&
        aligned(ko, n * out_bytes) && aligned(vo, n * out_bytes)) {
      vec_bytes = 16;
    }
  }

  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const DeviceFacts& facts = device_facts(device);
  const bool pdl = pdl_auto ? facts.major >= 9 : ((flags >> 5) & 1) != 0;
  const int sms = facts.sms;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  const int err = kvprof_store_kv_launch(
      ko, vo, loc.data_ptr(), loc.scalar_type() == at::kLong, kp, vp, ks, vs, tokens, k_out.size(0), rk, rv, in_kind,
      static_cast<int>(out_kind), static_cast<float>(k_inv), static_cast<float>(v_inv), k_scaled, v_scaled, vec_bytes,
      static_cast<int>(threads), !forced_shape, static_cast<int>(blocks_per_sm), sms, pdl, hw_fp8, stream);
  TORCH_CHECK(err == cudaSuccess, "cuda_fused: launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// The host-side c10 rule for fp32 -> e4m3fn overflow (true: saturate to 448, torch >= 2.12).
bool e4m3_saturates() { return c10::Float8_e4m3fn(470.0f).x == 0x7E; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kvprof fused K+V cache store";
  m.def("store_kv", &store_kv, "store_kv(k_out, v_out, loc, k_in, v_in, k_inv, v_inv, flags): K and V rows at loc");
  m.def("e4m3_saturates", &e4m3_saturates);
}
