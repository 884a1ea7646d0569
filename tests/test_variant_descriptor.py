"""One variant descriptor (``kvprof/core/variants.py``) is the single source of a built-in
writer's layout, role, colour, defaults and module: the registry, the layouts' roles, the
capture's and bench's default lists and the analysis' variant table all derive from it.

The proof: the change docs/architecture.md ("Adding a writer") describes -- one writer module
plus the documented ``VariantInfo`` line -- made in a copy of kvprof, then the writer looked
for everywhere it must appear, in a fresh interpreter running that copy.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.core import variants
from kvprof.kvcache.contracts import WRITER_CONTRACTS, RopeKVWriter
from kvprof.kvcache.layouts import LAYOUTS, get_layout
from kvprof.kvcache.writers import BUILTINS, REGISTRY

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

WRITER_MODULE = '''"""A test writer: two index_put copies, reported as one fused write."""

from __future__ import annotations

import torch

from kvprof.kvcache.contracts import FUSED, KVWriter, convert_pair


class MyStoreWriter(KVWriter):
    name = "my_store"
    description = "the descriptor test's writer"
    fused = True

    def write(self, k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, cache_k: torch.Tensor,
              cache_v: torch.Tensor, dtype: torch.dtype, k_scale: object = None, v_scale: object = None) -> str:
        if cache_k.dtype != k_buf.dtype or cache_v.dtype != v_buf.dtype:
            cache_k, cache_v = convert_pair(cache_k, cache_v, dtype, k_scale, v_scale)
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v
        return FUSED
'''

CHECK = '''
import sys
import kvprof
assert kvprof.__file__.startswith(sys.argv[1]), kvprof.__file__

# the analysis' side: torch-free, it reads the descriptor without importing any writer
from kvprof.core import variants
from kvprof.analysis import metrics  # noqa: F401  (the analysis imports the same table)
from kvprof.report import verdict  # noqa: F401
assert "torch" not in sys.modules, "the variant table or the analysis imported torch"
info = variants.info("my_store")
assert (info.role, info.colour, info.layout, info.claims_fused) == (variants.Role.KVPROF, "#123456", "mha", True), info
names = [v.name for v in variants.VARIANTS]
assert variants.ordered(["torch_compile", "my_store", "index_put"]) == sorted(
    ["torch_compile", "my_store", "index_put"], key=names.index)
assert "my_store" in variants.DEFAULT_CAPTURE_VARIANTS and "my_store" not in variants.DEFAULT_BENCH_VARIANTS
assert "my_store" in variants.KVPROF_FUSED

# the torch side: the registry, the layout's roles and defaults, capture's and bench's defaults
import torch
from kvprof.kvcache.writers import BUILTINS, REGISTRY, create_writer
from kvprof.kvcache.layouts import get_layout
from kvprof.kvcache.instrument import make_layout_pool
assert ("mha", "my_store", "kvprof.kvcache.writers.my_store:MyStoreWriter") in BUILTINS
assert "my_store" in REGISTRY.names("mha") and "my_store" not in REGISTRY.names("mla")
mha = get_layout("mha")
assert "my_store" in mha.fused and "my_store" in mha.roles()["fused"], mha.roles()
assert "my_store" in mha.capture_defaults and "my_store" not in get_layout("mla").capture_defaults
from kvprof.capture.config import CaptureConfig
assert "my_store" in CaptureConfig().variants
from kvprof.bench.run import BENCH_VARIANTS
assert "my_store" not in BENCH_VARIANTS

writer = create_writer("my_store")
assert type(writer).__module__ == "kvprof.kvcache.writers.my_store" and writer.name == "my_store"
pool = make_layout_pool("mha", 8, 1, torch.bfloat16, 2, 4, 1, writer=writer, instrument=True)
k, v = torch.randn(2, 2, 4).to(torch.bfloat16), torch.randn(2, 2, 4).to(torch.bfloat16)
mha.write(pool, 0, torch.tensor([3, 5]), k, v)
assert torch.equal(pool.get_key_buffer(0)[torch.tensor([3, 5])], k)
assert torch.equal(pool.get_value_buffer(0)[torch.tensor([3, 5])], v)
assert dict(pool.path_counts) == {"fused": 1}, dict(pool.path_counts)
import pandas as pd
from kvprof.analysis.write_kernels import BUILTIN_PATTERNS, classify
assert list(classify(pd.Series(["my_store_kernel", "my_store_kernel2"]), list(BUILTIN_PATTERNS))) == [
    "kvprof_fused", None]
print("descriptor-ok")
'''


def _documented_entry() -> str:
    """The ``VariantInfo`` line docs/architecture.md's "Adding a writer" tells one to add."""
    text = DOC.read_text()
    section = text[text.index("## Adding a writer"):]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "docs/architecture.md's 'Adding a writer' shows no VariantInfo line"
    return block.group(1)


@pytest.mark.slow  # a copy of the package and a fresh interpreter (torch's import)
def test_a_new_writer_is_one_module_plus_the_documented_line(tmp_path: Path) -> None:
    copy = tmp_path / "kvprof"
    shutil.copytree(ROOT / "kvprof", copy, ignore=shutil.ignore_patterns("__pycache__", "csrc", "samples"))
    (copy / "kvcache" / "writers" / "my_store.py").write_text(WRITER_MODULE)
    table = copy / "core" / "variants.py"
    before = table.read_text()
    entry = _documented_entry()
    anchor = "    # rope + store (the MHA layout's rope contract)"
    assert anchor in before
    after = before.replace(anchor, entry + anchor, 1)
    table.write_text(after)
    ast.parse(after)
    diff = [d for d in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if d[:1] in "+-" and d[:3] not in ("+++", "---")]
    assert all(d.startswith("+") for d in diff)  # nothing changed, only added
    added = ast.parse("\n".join(d[1:] for d in diff).strip().rstrip(","))
    assert len(added.body) == 1 and isinstance(added.body[0].value, ast.Call)  # one VariantInfo entry
    assert ast.unparse(added.body[0].value.func) == "VariantInfo"

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", CHECK, str(copy)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "descriptor-ok" in proc.stdout, proc.stderr[-3000:]


def test_the_registry_builtins_are_the_variant_tables_writers() -> None:
    """Every variant with a factory is registered for its layout, in table order, and nothing else is."""
    assert BUILTINS == variants.builtin_writers()
    for layout in LAYOUTS:
        expected = [v.name for v in variants.VARIANTS if v.layout == layout and v.factory]
        assert [n for n in REGISTRY.names(layout) if n in variants.BY_NAME] == expected
    assert all(v.factory.startswith("kvprof.kvcache.writers.") for v in variants.VARIANTS if v.factory)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layouts_roles_and_defaults_are_the_tables(layout: str) -> None:
    """A layout holds no list of its own: its roles and capture defaults are the variant table's."""
    spec = get_layout(layout)
    roles = variants.store_roles(layout)
    assert spec.roles() == roles
    assert (spec.reference, spec.unfused, spec.peers, spec.fused) == (
        roles["reference"][0], roles["unfused"][0], roles["peer"], roles["fused"])
    assert spec.capture_defaults == tuple(v.name for v in variants.VARIANTS if v.layout == layout and v.default_capture)
    assert set(spec.capture_defaults) <= set(REGISTRY.names(layout))
    assert variants.DEFAULT_CAPTURE_VARIANTS == get_layout("mha").capture_defaults
    assert spec.writer_bases == WRITER_CONTRACTS.bases(layout)


def test_the_analysis_finds_kvprofs_fused_writes_by_the_tables_kernels() -> None:
    """The analysis' kvprof_fused family is the union of the kvprof variants' kernel regexes,
    and each writer's own kernel name (where it states one) matches its variant's."""
    import importlib

    import regex

    from kvprof.analysis.write_kernels import BUILTIN_PATTERNS

    family = next(p for p in BUILTIN_PATTERNS if p.name == "kvprof_fused")
    assert family.regex == "|".join(variants.kvprof_write_kernels()) and family.regex
    named = 0
    for v in variants.VARIANTS:
        module, _, attr = v.factory.partition(":")
        kernel = getattr(getattr(importlib.import_module(module), attr), "kernel_name", None) if v.kernels else None
        if kernel:
            named += 1
            assert any(regex.search(k, kernel) for k in v.kernels), (v.name, kernel)
    assert named >= 1  # triton_fused states its Triton kernel (kernel_name): the check is not empty


def test_each_factory_builds_a_writer_of_its_layouts_contract() -> None:
    """The table's ``module:factory`` names a class implementing a contract of the entry's layout
    (checked on the classes: building some needs a GPU or a compiler)."""
    import importlib

    for v in variants.VARIANTS:
        if not v.factory:
            continue
        module, _, attr = v.factory.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        assert issubclass(cls, WRITER_CONTRACTS.bases(v.layout)), v.name
        assert issubclass(cls, RopeKVWriter) == bool(v.rope), v.name
