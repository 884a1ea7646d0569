"""SGLang before the fused kernel: K on the current stream, V on a second stream.

The streams are joined with ``wait_stream`` both ways. SGLang used the second stream
only while a CUDA graph was being captured (eagerly the extra synchronisation costs more
than the overlap gains); ``always=True`` uses it on every CUDA write. The returned path
says which one ran, so an eager run is never reported as overlapped.
"""

from __future__ import annotations

import torch

from kvprof.kvcache.contracts import TWO_COPIES, TWO_STREAMS, KVWriter, convert_pair


class TwoStreamWriter(KVWriter):
    name = "two_stream"
    description = "K on the current stream, V on a second stream, joined with wait_stream"
    fused = False
    devices = ("cpu", "cuda")

    def __init__(self, always: bool = False) -> None:
        self.always = bool(always)
        self._alt: dict[int, torch.cuda.Stream] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self.always and device.type != "cuda":
            return "two_stream(always=True) needs CUDA streams"
        return super().unsupported_reason(device, dtype, input_dtype)

    def prepare(self, device: torch.device) -> None:
        # created up front, as SGLang's pool does: never inside a graph capture
        if device.type == "cuda":
            self._alt_stream(device)

    def _alt_stream(self, device: torch.device) -> torch.cuda.Stream:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = self._alt.get(index)
        if stream is None:
            stream = self._alt[index] = torch.cuda.Stream(device=index)
        return stream

    def write(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> str:
        if cache_k.dtype != k_buf.dtype or cache_v.dtype != v_buf.dtype:
            cache_k, cache_v = convert_pair(cache_k, cache_v, dtype, k_scale, v_scale)
        if not (k_buf.is_cuda and (self.always or torch.cuda.is_current_stream_capturing())):
            k_buf[loc] = cache_k
            v_buf[loc] = cache_v
            return TWO_COPIES
        current = torch.cuda.current_stream(k_buf.device)
        alt = self._alt_stream(k_buf.device)
        alt.wait_stream(current)
        k_buf[loc] = cache_k
        with torch.cuda.stream(alt):
            v_buf[loc] = cache_v
        current.wait_stream(alt)
        return TWO_STREAMS
