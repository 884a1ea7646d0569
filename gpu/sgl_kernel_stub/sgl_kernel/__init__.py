"""A stand-in for sgl-kernel where it is not installed (its wheel is ~535 MB), so that SGLang's
modules that import its kernels at load time (quantization, attention backends) import.

Every name is a placeholder: calling one, or reading a value from one, raises. SGLang's KV-pool
write path (its JIT store_cache kernel) does not use sgl-kernel, so a run that finishes with this
stub on the path shows that the path never touched it. gpu/sglang_check.sh puts it on the path
only when the real package does not import, and says so in its log.
"""

from __future__ import annotations

STUB = True
__version__ = "0.0.0+stub"


class Missing:
    """A name sgl-kernel would export; any use but importing it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{self._name} was called, but sgl-kernel is a stub here (not installed)")

    def __repr__(self) -> str:
        return f"<sgl-kernel stub {self._name}>"


def stub_getattr(module: str):  # noqa: ANN201
    def getattr_(name: str) -> Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{module}.{name}")

    return getattr_


__getattr__ = stub_getattr("sgl_kernel")
