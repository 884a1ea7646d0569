"""Write implementations, registered by name. See ``registry`` for adding your own."""

from __future__ import annotations

from kvprof.argtypes import typed_options
from kvprof.core.errors import UsageError
from kvprof.core.vocab import FALLBACK_PREFIX, FUSED, TWO_COPIES, TWO_STREAMS, is_fused_path
from kvprof.writers.base import KVWriter
from kvprof.writers.registry import REGISTRY, WriterRegistry, create_writer, register, writer_names


def _builtin(name: str, module: str, cls: str):  # noqa: ANN202
    """Import a built-in writer only when it is asked for (triton, compilers, sgl-kernel)."""

    def factory(**options: object) -> KVWriter:
        import importlib

        try:
            mod = importlib.import_module(f"kvprof.writers.{module}")
        except ImportError as exc:
            raise UsageError(f"writer {module} cannot be imported: {exc}") from None
        writer_class = getattr(mod, cls)
        try:  # a boolean option given as text ("no") is made a bool, or refused
            return writer_class(**typed_options(writer_class, options, name))
        except TypeError as exc:  # unknown option names
            raise UsageError(f"bad option for writer {module}: {exc}") from None

    return factory


# The order here is the order of tables and charts.
for _name, _module, _cls in (
    ("index_put", "index_put", "IndexPutWriter"),
    ("two_stream", "two_stream", "TwoStreamWriter"),
    ("sgl_kernel", "sgl_kernel", "SglKernelWriter"),
    ("sgl_kernel_cubin", "sgl_cubin", "SglKernelCubinWriter"),
    ("triton_fused", "triton_fused", "TritonFusedWriter"),
    ("cuda_fused", "cuda_fused", "CudaFusedWriter"),
    ("store_kv_fused", "store_kv_fused", "StoreKVFusedWriter"),
    ("torch_compile", "torch_compile", "TorchCompileWriter"),
    ("sglang_store_cache", "sglang_store_cache", "SglangStoreCacheWriter"),
):
    register(_name, _builtin(_name, _module, _cls))

__all__ = [
    "FALLBACK_PREFIX", "FUSED", "TWO_COPIES", "TWO_STREAMS", "KVWriter", "REGISTRY",
    "WriterRegistry", "create_writer", "is_fused_path", "register", "writer_names",
]
