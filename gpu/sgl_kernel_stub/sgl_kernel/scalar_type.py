"""Stand-in submodule: see sgl_kernel/__init__.py."""

from sgl_kernel import stub_getattr

__getattr__ = stub_getattr("sgl_kernel.scalar_type")
