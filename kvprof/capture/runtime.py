"""What a capture sets up in its own process before any writer is built.

* On a CPU, kvprof's Triton writers run their kernels under Triton's interpreter, which
  Triton decides when a kernel is decorated, i.e. when its module is imported, from
  ``TRITON_INTERPRET``. A capture on a CPU sets ``TRITON_INTERPRET=1`` itself when the
  environment does not say (an explicit value, 0 included, is the user's choice and is
  kept), before it builds any writer, so that ``triton_fused`` runs on a first try
  instead of being refused. Child processes (the nsys pass, the ranks) inherit it.
* torch's intra-op CPU threads: one on a CPU unless ``--threads`` says (the writes are
  small; a second thread on a shared machine made them swing by orders of magnitude),
  restored when the capture ends.

Both land in the manifest (``config.threads``, ``config.resolved.triton_interpret``) and
in the capture's first lines.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvprof.capture.config import CaptureConfig
from kvprof.kvcache.devinfo import TRITON_WRITER_MODULES, resolve_device, triton_interpreter


@dataclass(frozen=True)
class Runtime:
    """The process settings a capture ran under."""

    device: torch.device
    threads: int  # torch's intra-op threads while the writes ran
    # "set by kvprof" (a CPU, the variable unset), "from the environment" (TRITON_INTERPRET=1
    # already there), or None: Triton kernels are compiled (CUDA) or the user turned it off
    triton_interpret: str | None

    def as_dict(self) -> dict[str, object]:
        return {"threads": self.threads, "triton_interpret": self.triton_interpret}


def prepare(config: CaptureConfig) -> tuple[CaptureConfig, Runtime]:
    """Validate ``config`` and resolve the device and the device-dependent defaults (a new,
    resolved configuration; ``config`` itself is left as it was), set Triton's interpreter up."""
    checked = config.validate()
    device = resolve_device(checked.device)
    resolved = checked.resolved_for(device.type)
    interpret = triton_interpreter(device)
    threads = resolved.threads if resolved.threads is not None else torch.get_num_threads()
    return resolved, Runtime(device=device, threads=threads, triton_interpret=interpret)


__all__ = ["TRITON_WRITER_MODULES", "Runtime", "prepare", "triton_interpreter"]
