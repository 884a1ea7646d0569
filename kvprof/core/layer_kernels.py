"""What a ``--context layer`` capture ran around each write: its attention and rotary kernels.

Written by the capture into the manifest (``config.resolved.layer``), read by the report
to print it; torch-free, so both sides share one definition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SGLANG_DECODE = "sglang_triton_decode"  # sglang.kernels.ops.attention.decode_attention.decode_attention_fwd
TORCH_SDPA = "torch_sdpa"
TRITON_ROTARY = "kvprof_triton_rotary"  # kvprof.kvcache.writers.rope_triton.TritonRope.rotate: one launch, q and k
TORCH_ROTARY = "torch_inplace"


@dataclass(frozen=True)
class LayerKernels:
    """The layer's kernels around the write, and why where one is a stand-in for the engine's."""

    attention: str  # decode attention: SGLANG_DECODE or TORCH_SDPA
    attention_reason: str | None  # why not SGLang's decode kernel; None when it ran
    rotary: str  # TRITON_ROTARY or TORCH_ROTARY
    rotary_reason: str | None  # why not kvprof's Triton rotary kernel; None when it ran
    prefill_attention: str = TORCH_SDPA  # causal over the chunk
    rope: dict[str, Any] = field(default_factory=dict)  # the rotary embedding's parameters

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> LayerKernels | None:
        """None for anything that is not what ``as_dict`` wrote."""
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in ("attention", "rotary")):
            return None

        def text(key: str) -> str | None:
            v = doc.get(key)
            return v if isinstance(v, str) else None

        return cls(attention=doc["attention"], attention_reason=text("attention_reason"), rotary=doc["rotary"],
                   rotary_reason=text("rotary_reason"), prefill_attention=text("prefill_attention") or TORCH_SDPA,
                   rope=dict(doc["rope"]) if isinstance(doc.get("rope"), dict) else {})

    def describe(self) -> str:
        """One line: the decode attention and the rotary, each with its reason where it is a stand-in."""
        att = ("SGLang's Triton decode attention (decode_attention_fwd)" if self.attention == SGLANG_DECODE
               else f"torch SDPA over the gathered rows ({self.attention_reason or 'no reason recorded'})")
        rot = ("kvprof's Triton rotary kernel, q and k in place, one launch" if self.rotary == TRITON_ROTARY
               else f"torch ops in place ({self.rotary_reason or 'no reason recorded'})")
        return f"decode attention: {att}; rotary: {rot}"


__all__ = ["SGLANG_DECODE", "TORCH_ROTARY", "TORCH_SDPA", "TRITON_ROTARY", "LayerKernels"]
