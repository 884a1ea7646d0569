"""The serving benchmark kvprof's projection is held against (SGLang PR #9775).

Apart from kvprof.analysis.compare so that the command-line parser can show its
defaults without importing pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvprof.core.numbers import finite_positive


@dataclass(frozen=True)
class Benchmark:
    """The serving benchmark the projection is compared with."""

    itl_before_ms: float = 12.05
    itl_after_ms: float = 11.87
    layers: int = 80
    batch: int = 10
    label: str = "SGLang #9775: Llama-3.1-70B TP8, 10 requests, two_stream -> fused"

    def __post_init__(self) -> None:  # 0 divided the projection; NaN passed every "> 0" test
        finite_positive(self.itl_before_ms, "itl_before_ms")
        finite_positive(self.itl_after_ms, "itl_after_ms")
        finite_positive(self.layers, "layers")

    @property
    def measured_saving_ms(self) -> float:
        return self.itl_before_ms - self.itl_after_ms
