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
from kvprof.kvcache.devinfo import resolve_device, triton_interpreter


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


def start(device: torch.device, threads: int | None) -> Runtime:
    """Set Triton's interpreter up for ``device`` (before any writer is built); the settings the
    capture will run under (``threads``: the plan's, None for torch's own)."""
    interpret = triton_interpreter(device)
    return Runtime(device=device, threads=threads if threads is not None else torch.get_num_threads(),
                   triton_interpret=interpret)


def prepare(config: CaptureConfig) -> tuple[CaptureConfig, Runtime]:
    """The configuration form of a capture's start: ``config`` validated and resolved for its
    device (a new configuration; ``config`` itself is left as it was), Triton's interpreter set
    up. A capture itself resolves into a plan (``kvprof.capture.plan.resolve``) and calls ``start``."""
    checked = config.validate()
    device = resolve_device(checked.device)
    resolved = checked.resolved_for(device.type)
    return resolved, start(device, resolved.threads)


__all__ = ["Runtime", "prepare", "start", "triton_interpreter"]
