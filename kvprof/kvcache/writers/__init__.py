"""Write implementations of every layout, registered by (layout, name). See ``registry`` for adding your own."""

from __future__ import annotations

from kvprof.core.vocab import FALLBACK_PREFIX, FUSED, ROPE_FUSED, TWO_COPIES, TWO_STREAMS, is_fused_path
from kvprof.kvcache.writers.base import KVWriter
from kvprof.kvcache.writers.registry import REGISTRY, WriterRegistry, builtin, create_writer, register, writer_names

# (layout, name, module under kvprof.kvcache.writers, class); the order is the order of tables and charts
BUILTINS: tuple[tuple[str, str, str, str], ...] = (
    ("mha", "index_put", "index_put", "IndexPutWriter"),
    ("mha", "two_stream", "two_stream", "TwoStreamWriter"),
    ("mha", "sgl_kernel", "sgl_kernel", "SglKernelWriter"),
    ("mha", "sgl_kernel_cubin", "sgl_cubin", "SglKernelCubinWriter"),
    ("mha", "triton_fused", "triton_fused", "TritonFusedWriter"),
    ("mha", "cuda_fused", "cuda_fused", "CudaFusedWriter"),
    ("mha", "store_kv_fused", "store_kv_fused", "StoreKVFusedWriter"),
    ("mha", "torch_compile", "torch_compile", "TorchCompileWriter"),
    ("mha", "sglang_store_cache", "sglang_store_cache", "SglangStoreCacheWriter"),
    # the MHA layout's rope contract (RopeKVWriter): rotary embedding of q and k plus the store
    ("mha", "rope_then_store", "rope_triton", "RopeThenStoreWriter"),
    ("mha", "rope_then_two_stream", "rope_triton", "RopeThenTwoStreamWriter"),
    ("mha", "rope_then_triton_fused", "rope_triton", "RopeThenTritonFusedWriter"),
    ("mha", "rope_triton_fused", "rope_triton", "RopeTritonFusedWriter"),
    ("mha", "rope_cuda_fused", "rope_cuda", "RopeCudaWriter"),
    ("mha", "sglang_rope_store", "rope_sglang", "SglangRopeStoreWriter"),
    ("mha", "sglang_triton_rope_cache", "rope_sglang", "SglangTritonRopeCacheWriter"),
    ("mha", "sgl_kernel_rope_cubin", "rope_sgl_cubin", "SglKernelRopeCubinWriter"),
    ("mla", "mla_index_put", "mla_torch", "MLAIndexPutWriter"),
    ("mla", "mla_cat_copy", "mla_torch", "MLACatCopyWriter"),
    ("mla", "sglang_mla", "mla_sglang", "SglangMLAWriter"),
    ("mla", "mla_triton", "mla_triton", "MLATritonWriter"),
    ("mla", "mla_cuda", "layout_cuda", "MLACudaWriter"),
    ("paged", "paged_index_put", "paged_torch", "PagedIndexPutWriter"),
    ("paged", "paged_unfused", "paged_torch", "PagedUnfusedWriter"),
    ("paged", "paged_triton", "paged_triton", "PagedTritonWriter"),
    ("paged", "paged_cuda", "layout_cuda", "PagedCudaWriter"),
)
for _layout, _name, _module, _cls in BUILTINS:
    register(_name, builtin(_name, _module, _cls), layout=_layout)

__all__ = [
    "BUILTINS", "FALLBACK_PREFIX", "FUSED", "ROPE_FUSED", "TWO_COPIES", "TWO_STREAMS", "KVWriter", "REGISTRY",
    "WriterRegistry", "create_writer", "is_fused_path", "register", "writer_names",
]
