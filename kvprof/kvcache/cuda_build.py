"""kvprof's compiled ops, built at first use the same way for every op: the CUDA ops, and
the host-only C++ helper of the Triton launcher (``cuda=False``: a C++ compiler, no CUDA).

``torch.utils.cpp_extension.load`` into ``$TORCH_EXTENSIONS_DIR`` or
``~/.cache/kvprof/torch_extensions/<op>_torch<version>_cu<version>``, ``-O3``, sm_90 plus the
current device's arch. The whole build output (ninja, nvcc, ptxas) is appended to
``build.log`` there; a failed build is one line naming that log, and the writer reports itself
unavailable with it -- never a traceback. Each op is built at most once per process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch


def find_nvcc() -> str | None:
    """nvcc from CUDA_HOME (as torch's build uses it) or PATH."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        CUDA_HOME = None  # noqa: N806
    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / "nvcc"
        if candidate.exists():
            return str(candidate)
    return shutil.which("nvcc")


def arch_flags() -> list[str]:
    """sm_90 always (Hopper, where kvprof's figures come from), plus the current device's arch where it differs."""
    flags = ["-gencode=arch=compute_90,code=sm_90"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}"
        if arch != "90":
            flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send fds 1 and 2 (ninja, nvcc, ptxas write there, not to sys.stdout) to ``log`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "ab") as f:
        f.write(f"\n===== build at {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
        f.flush()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


class CudaOp:
    """One compiled op: ``load()`` gives (module, None) or (None, a one-line reason), built once.

    ``label`` names the op in the reason; ``cuda_flags`` are added after ``-O3`` and the archs;
    ``cuda=False``: C++ sources only, built wherever a C++ compiler is (no GPU, no nvcc)."""

    def __init__(self, name: str, sources: Sequence[Path], label: str, cuda_flags: Sequence[str] = (),
                 cuda: bool = True) -> None:
        self.name, self.sources, self.label, self.cuda_flags = name, list(sources), label, list(cuda_flags)
        self.cuda = cuda
        self.module: Any = None
        self.error: str | None = None

    def build_dir(self) -> Path:
        base = os.environ.get("TORCH_EXTENSIONS_DIR")
        root = Path(base) if base else Path.home() / ".cache" / "kvprof" / "torch_extensions"
        tag = f"torch{torch.__version__.split('+')[0]}_cu{(torch.version.cuda or 'none').replace('.', '')}"
        return root / f"{self.name}_{tag}"

    def load(self) -> tuple[Any, str | None]:
        if self.module is not None or self.error is not None:
            return self.module, self.error
        if not self.cuda:
            if shutil.which(os.environ.get("CXX") or "c++") is None:
                self.error = f"no C++ compiler ({os.environ.get('CXX') or 'c++'}) found"
            else:
                self.module, self.error = self._build()
        elif not torch.cuda.is_available():
            self.error = "needs CUDA (torch.cuda is not available)"
        elif find_nvcc() is None:
            self.error = "no CUDA compiler (nvcc) found"
        else:
            self.module, self.error = self._build()
        return self.module, self.error

    def _build(self) -> tuple[Any, str | None]:
        directory = self.build_dir()
        log = directory / "build.log"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            from torch.utils.cpp_extension import load

            with output_to(log):
                cuda_flags = ["-O3", *arch_flags(), *self.cuda_flags] if self.cuda else None
                module = load(name=self.name, sources=[str(s) for s in self.sources], extra_cflags=["-O3"],
                              extra_cuda_cflags=cuda_flags, build_directory=str(directory), verbose=True,
                              with_cuda=self.cuda)
        except Exception as exc:  # compiler error, missing ninja, ABI mismatch...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            return None, f"{self.label} build failed ({type(exc).__name__}: {first}); see {log}"
        return module, None


def op_refusal(exc: RuntimeError, prefix: str) -> Exception:
    """What a writer raises for its compiled op's ``RuntimeError``: the op's own check (a
    ``TORCH_CHECK`` whose message starts with ``prefix``, raised before anything is launched) as
    the one-line ``ValueError`` every writer refuses a call with; anything else (a failed
    launch, a CUDA error) as it came."""
    for line in str(exc).splitlines():
        at = line.find(prefix)
        if at >= 0 and "launch failed" not in line:
            return ValueError(line[at:].strip())
    return exc
