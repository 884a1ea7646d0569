"""What kvprof knows about each write variant, in one place: layout, role, colour, order,
defaults and the writer that implements it.

Tables, charts, NVTX ranges, capture and bench all read this table, so a variant has the
same colour and the same place everywhere; the writer registry registers every entry's
``factory`` (a ``module:factory`` string, data: ``kvprof.kvcache.writers`` registers it and
imports it when the writer is first built), the layouts read their roles and capture defaults from it. So a
new built-in writer is its module plus one ``VariantInfo`` line here (docs/architecture.md,
"Adding a writer"). Torch-free: the analysis and the dashboard use it without importing the
writers. A variant that is not listed here (a third party's writer) gets a stable colour from
its name and the role ``other``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    """Why a variant is in a comparison."""

    REFERENCE = "reference"  # the simplest correct write: two plain copies
    BASELINE = "baseline"    # what SGLang did before fused writes; ratios are against it
    PEER = "peer"            # another project's fused kernel (sgl-kernel, SGLang's JIT kernel)
    KVPROF = "kvprof"        # kvprof's own fused writers
    OTHER = "other"          # registered by a third party


@dataclass(frozen=True)
class VariantInfo:
    name: str
    role: Role
    colour: str          # "#rrggbb"; colour-blind-safe palette (Okabe-Ito + Tol), one per variant
    label: str           # what the variant is, in a few words
    default_capture: bool = False
    default_bench: bool = False
    claims_fused: bool = False  # the writer promises one launch for K and V
    rope: str = ""  # a rope + store writer (RopeKVWriter): "fused" (one launch) or "separate"
    layout: str = "mha"  # the cache layout it writes (kvprof.kvcache.contracts.LAYOUTS)
    factory: str = ""  # "module:factory" of kvprof's writer ("": none, e.g. a third party's)
    # regexes of the kernel names its write launches as a trace spells them (one per kernel it
    # may launch); the analysis finds kvprof's fused writes in an engine's trace by them
    kernels: tuple[str, ...] = ()

    @property
    def argb(self) -> int:
        """The colour as NVTX's 0xAARRGGBB."""
        return 0xFF000000 | int(self.colour[1:], 16)


# The order here is the order of tables and charts.
VARIANTS: tuple[VariantInfo, ...] = (
    VariantInfo("index_put", Role.REFERENCE, "#7f7f7f", "two index_put copies, one stream",
                default_capture=True, default_bench=True,
                factory="kvprof.kvcache.writers.index_put:IndexPutWriter"),
    VariantInfo("two_stream", Role.BASELINE, "#e69f00", "two copies on two CUDA streams (SGLang before fusion)",
                default_capture=True, default_bench=True,
                factory="kvprof.kvcache.writers.two_stream:TwoStreamWriter"),
    VariantInfo("sgl_kernel", Role.PEER, "#56b4e9", "sgl-kernel's store_kv_cache op",
                default_capture=True, default_bench=True, claims_fused=True,
                factory="kvprof.kvcache.writers.sgl_kernel:SglKernelWriter"),
    VariantInfo("sgl_kernel_cubin", Role.PEER, "#0072b2", "sgl-kernel's store_kv_cache kernels from the wheel's cubin",
                default_capture=True, default_bench=True, claims_fused=True,
                factory="kvprof.kvcache.writers.sgl_cubin:SglKernelCubinWriter"),
    VariantInfo("triton_fused", Role.KVPROF, "#009e73", "kvprof's fused Triton kernel",
                default_capture=True, default_bench=True, claims_fused=True,
                factory="kvprof.kvcache.writers.triton_fused:TritonFusedWriter",
                kernels=(r"\b_store_kv_kernel\b",)),
    VariantInfo("cuda_fused", Role.KVPROF, "#cc79a7", "kvprof's fused CUDA kernel (compiled op)",
                default_capture=True, default_bench=True, claims_fused=True,
                factory="kvprof.kvcache.writers.cuda_fused:CudaFusedWriter",
                kernels=(r"\bkvprof::store_kv_kernel\b", r"\bkvprof_store_kv\w*")),
    VariantInfo("store_kv_fused", Role.KVPROF, "#d55e00", "kvprof's fused kernel in sgl-kernel's form",
                default_capture=True, default_bench=True, claims_fused=True,
                factory="kvprof.kvcache.writers.store_kv_fused:StoreKVFusedWriter",
                kernels=(r"\b_store_kv_kernel\b", r"\bkvprof::store_kv_kernel\b", r"\bkvprof_store_kv\w*")),
    VariantInfo("torch_compile", Role.KVPROF, "#882255", "torch.compile of the two copies",
                default_bench=True,
                factory="kvprof.kvcache.writers.torch_compile:TorchCompileWriter"),
    VariantInfo("sglang_store_cache", Role.PEER, "#332288", "SGLang's JIT store_cache kernel",
                claims_fused=True,
                factory="kvprof.kvcache.writers.sglang_store_cache:SglangStoreCacheWriter"),
    VariantInfo("sglang_set_kv_buffer", Role.PEER, "#6699cc",
                "SGLang's set_kv_buffer, its own code (fp8 cache: div_, .to, .view, store_cache)",
                factory="kvprof.kvcache.writers.sglang_set_kv_buffer:SglangSetKVBufferWriter"),
    VariantInfo("set_kv_buffer_torch", Role.BASELINE, "#997700",
                "SGLang's set_kv_buffer as torch ops (fp8 cache: div_, .to, .view, two index_put)",
                factory="kvprof.kvcache.writers.sglang_set_kv_buffer:SetKVBufferTorchWriter"),
    # rope + store (the MHA layout's rope contract): the rotary embedding of q and k with the write
    VariantInfo("rope_then_store", Role.REFERENCE, "#4477aa", "rope kernel, then a store chosen by store=",
                rope="separate",
                factory="kvprof.kvcache.writers.rope_triton:RopeThenStoreWriter"),
    VariantInfo("rope_then_two_stream", Role.BASELINE, "#ee6677", "rope kernel, then two copies on two streams",
                rope="separate",
                factory="kvprof.kvcache.writers.rope_triton:RopeThenTwoStreamWriter"),
    VariantInfo("rope_then_triton_fused", Role.KVPROF, "#ccbb44", "rope kernel, then kvprof's fused Triton store",
                claims_fused=True, rope="separate",
                factory="kvprof.kvcache.writers.rope_triton:RopeThenTritonFusedWriter"),
    VariantInfo("rope_triton_fused", Role.KVPROF, "#228833", "kvprof's Triton rope + store in one launch",
                claims_fused=True, rope="fused",
                factory="kvprof.kvcache.writers.rope_triton:RopeTritonFusedWriter"),
    VariantInfo("rope_cuda_fused", Role.KVPROF, "#117733", "kvprof's CUDA rope + store in one launch",
                claims_fused=True, rope="fused",
                factory="kvprof.kvcache.writers.rope_cuda:RopeCudaWriter"),
    VariantInfo("sglang_rope_store", Role.PEER, "#88ccee", "SGLang's JIT rope + store (FusedSetKVBufferArg)",
                claims_fused=True, rope="fused",
                factory="kvprof.kvcache.writers.rope_sglang:SglangRopeStoreWriter"),
    VariantInfo("sglang_triton_rope_cache", Role.PEER, "#44aa99", "SGLang's Triton fused_qk_rope_reshape_and_cache",
                claims_fused=True, rope="fused",
                factory="kvprof.kvcache.writers.rope_sglang:SglangTritonRopeCacheWriter"),
    VariantInfo("sgl_kernel_rope_cubin", Role.PEER, "#aa4499",
                "sgl-kernel's rope + set-kv kernels from the wheel's cubin",
                claims_fused=True, rope="fused",
                factory="kvprof.kvcache.writers.rope_sgl_cubin:SglKernelRopeCubinWriter"),
    # the MLA latent layout (kvprof.kvcache.layouts.mla): its reference, SGLang's unfused path, peer, fused
    # the MLA reference drops slot 0 with a host sync: a check, not a captured variant
    VariantInfo("mla_index_put", Role.REFERENCE, "#bbbbbb", "MLA: cast, index_put of nope and rope",
                layout="mla", factory="kvprof.kvcache.writers.mla_torch:MLAIndexPutWriter"),
    VariantInfo("mla_cat_copy", Role.BASELINE, "#ddcc77", "MLA: torch.cat then one copy (SGLang unfused)",
                layout="mla", default_capture=True, factory="kvprof.kvcache.writers.mla_torch:MLACatCopyWriter"),
    VariantInfo("sglang_mla", Role.PEER, "#88ccee", "MLA: SGLang's set_mla_kv_buffer kernel", claims_fused=True,
                layout="mla", default_capture=True, factory="kvprof.kvcache.writers.mla_sglang:SglangMLAWriter"),
    VariantInfo("vllm_concat_and_cache_mla", Role.PEER, "#cc6677", "MLA: vLLM's concat_and_cache_mla kernel",
                claims_fused=True, layout="mla",
                factory="kvprof.kvcache.writers.vllm_peers:VllmMLAWriter"),
    VariantInfo("mla_triton", Role.KVPROF, "#117733", "MLA: kvprof's fused Triton store", claims_fused=True,
                layout="mla", default_capture=True, factory="kvprof.kvcache.writers.mla_triton:MLATritonWriter"),
    VariantInfo("mla_cuda", Role.KVPROF, "#aa4499", "MLA: kvprof's fused CUDA store (compiled op)", claims_fused=True,
                layout="mla", default_capture=True, factory="kvprof.kvcache.writers.layout_cuda:MLACudaWriter"),
    # vLLM's paged layout (kvprof.kvcache.layouts.paged)
    # the paged reference drops padded slots with a host sync: a check, not a captured variant
    VariantInfo("paged_index_put", Role.REFERENCE, "#555555", "paged: convert, index_put K then V",
                layout="paged", factory="kvprof.kvcache.writers.paged_torch:PagedIndexPutWriter"),
    VariantInfo("paged_unfused", Role.BASELINE, "#999933", "paged: vLLM's write as separate torch ops",
                layout="paged", default_capture=True, factory="kvprof.kvcache.writers.paged_torch:PagedUnfusedWriter"),
    VariantInfo("vllm_reshape_and_cache_flash", Role.PEER, "#ee7733",
                "paged: vLLM's reshape_and_cache_flash kernel", claims_fused=True, layout="paged",
                factory="kvprof.kvcache.writers.vllm_peers:VllmPagedWriter"),
    VariantInfo("paged_triton", Role.KVPROF, "#44aa99", "paged: kvprof's fused Triton store", claims_fused=True,
                layout="paged", default_capture=True, factory="kvprof.kvcache.writers.paged_triton:PagedTritonWriter"),
    VariantInfo("paged_cuda", Role.KVPROF, "#661100",
                "paged: kvprof's fused CUDA store (compiled op)", claims_fused=True,
                layout="paged", default_capture=True, factory="kvprof.kvcache.writers.layout_cuda:PagedCudaWriter"),
)
BY_NAME: dict[str, VariantInfo] = {v.name: v for v in VARIANTS}
BASELINE = "two_stream"



def capture_defaults(layout: str = "mha") -> tuple[str, ...]:
    """What a capture of ``layout`` runs when no variants are named (table order)."""
    return tuple(v.name for v in VARIANTS if v.default_capture and v.layout == layout)


def store_roles(layout: str) -> dict[str, tuple[str, ...]]:
    """The built-in store writers of ``layout`` by role (rope + store writers have a contract of
    their own): "reference" (the bit-exact plain copies), "unfused" (the engine's write without
    a fused kernel), "peer" (the engine's own fused kernels), "fused" (kvprof's fused writers)."""
    store = [v for v in VARIANTS if v.layout == layout and not v.rope]
    return {"reference": tuple(v.name for v in store if v.role is Role.REFERENCE),
            "unfused": tuple(v.name for v in store if v.role is Role.BASELINE),
            "peer": tuple(v.name for v in store if v.role is Role.PEER),
            "fused": tuple(v.name for v in store if v.role is Role.KVPROF and v.claims_fused)}


def kvprof_write_kernels() -> tuple[str, ...]:
    """The regexes of kvprof's own fused write kernels, each once, in table order."""
    return tuple(dict.fromkeys(k for v in VARIANTS if v.role is Role.KVPROF for k in v.kernels))


def builtin_writers() -> tuple[tuple[str, str, str], ...]:
    """(layout, name, "module:factory") of every variant kvprof implements, in table order."""
    return tuple((v.layout, v.name, v.factory) for v in VARIANTS if v.factory)


DEFAULT_CAPTURE_VARIANTS: tuple[str, ...] = capture_defaults("mha")
DEFAULT_BENCH_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.default_bench)
PEERS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.role is Role.PEER)
KVPROF_FUSED: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.role is Role.KVPROF and v.claims_fused
                                      and not v.rope)
ROPE_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.rope)
ROPE_KVPROF_FUSED: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.role is Role.KVPROF and v.rope == "fused")
ROPE_PEERS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.role is Role.PEER and v.rope)


def info(name: str) -> VariantInfo:
    """The variant's metadata; unknown names get a stable colour derived from the name."""
    known = BY_NAME.get(name)
    if known is not None:
        return known
    rgb = zlib.crc32(name.encode()) & 0x00FFFFFF
    return VariantInfo(name, Role.OTHER, f"#{rgb:06x}", "registered by a third party")


def colour(name: str) -> str:
    return info(name).colour


def order_key(name: str) -> tuple[int, str]:
    """Sort key: built-ins in table order, then the rest by name."""
    names = [v.name for v in VARIANTS]
    return (names.index(name), "") if name in names else (len(names), name)


def ordered(names: list[str] | tuple[str, ...]) -> list[str]:
    return sorted(dict.fromkeys(names), key=order_key)
