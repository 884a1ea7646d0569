"""vLLM's cache kernels as peers, on a CPU: the source extraction (verbatim pieces, the one
derived MLA kernel, refusals of a tree it does not know) and the writers' one-line refusals.
The kernels themselves run in tests/test_layouts_gpu.py (-m gpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvprof.core.errors import UsageError
from kvprof.kvcache.layouts.layout import get_layout
from kvprof.kvcache.writers import create_writer, vllm_peers
from kvprof.kvcache.writers.vllm_src_extract import GENERATED, HEADERS, extract, main

COPY_OP = """template <typename OutT, typename InT, Fp8KVCacheDataType kv_dt>
struct CopyWithScaleOp {
  float scale;
  __device__ void operator()(OutT& dst, const InT src) const { dst = src; }
};"""
FLASH = """template <typename scalar_t, typename cache_t, Fp8KVCacheDataType kv_dt>
__global__ void reshape_and_cache_flash_kernel(const int64_t* slot_mapping) {
  if (slot_mapping[0] < 0) {
    return;
  }
}"""
MLA = """template <typename scalar_t, typename cache_t, Fp8KVCacheDataType kv_dt>
__global__ void concat_and_cache_mla_kernel(
    const int64_t* __restrict__ slot_mapping,  // [num_tokens]
    const float* scale                         //
) {
  const int64_t slot_idx = slot_mapping[blockIdx.x];
  if (slot_idx < 0) {
    return;
  }
  { int nested = 0; (void)nested; }
}"""


def _tree(root: Path, mla: str = MLA) -> Path:
    (root / "csrc").mkdir(parents=True)
    (root / "LICENSE").write_text("Apache License 2.0\n")
    (root / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 9.9.9\n")
    for h in HEADERS:
        (root / "csrc" / h).parent.mkdir(parents=True, exist_ok=True)
        (root / "csrc" / h).write_text(f"// {h}\n")
    (root / "csrc" / "cache_kernels.cu").write_text(
        f"#include \"x.h\"\nnamespace vllm {{\n{COPY_OP}\n\ntemplate <typename T>\n__global__ void other(T x) {{}}\n\n"
        f"{FLASH}\n\n{mla}\n}}  // namespace vllm\nvoid host() {{ }}\n")
    return root


def test_extract_takes_the_kernels_verbatim_and_derives_the_skip_kernel(tmp_path: Path) -> None:
    out = tmp_path / "out"
    info = extract(_tree(tmp_path / "vllm"), out)
    text = (out / "include" / GENERATED).read_text()
    for piece in (COPY_OP, FLASH, MLA):
        assert piece in text
    assert "void other(" not in text and "void host()" not in text
    assert "concat_and_cache_mla_skip_kernel(" in text
    assert "if (slot_idx < 0 || slot_idx == kvprof_skip_slot) {" in text
    assert "const int64_t kvprof_skip_slot" in text
    assert info["vllm_version"] == "9.9.9"
    assert json.loads((out / "SOURCE.json").read_text())["sha256"].keys() >= {"LICENSE", "csrc/cache_kernels.cu"}
    assert all((out / "include" / h).is_file() for h in HEADERS) and (out / "LICENSE").is_file()


@pytest.mark.parametrize("change", ["missing", "changed_mla", "no_tree"])
def test_extract_refuses_a_tree_it_does_not_know(tmp_path: Path, change: str, capsys) -> None:
    root = tmp_path / "vllm"
    if change == "missing":
        _tree(root, mla="")
    elif change == "changed_mla":
        _tree(root, mla=MLA.replace("if (slot_idx < 0) {", "if (slot_idx <= -1) {"))
    else:
        root.mkdir()
    with pytest.raises(UsageError):
        extract(root, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert main([str(root), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvprof: ") and "\n" not in err


def test_the_peers_are_the_layouts_peers() -> None:
    assert "vllm_reshape_and_cache_flash" in get_layout("paged").peers
    assert "vllm_concat_and_cache_mla" in get_layout("mla").peers


@pytest.mark.parametrize("layout,name", [("paged", "vllm_reshape_and_cache_flash"),
                                         ("mla", "vllm_concat_and_cache_mla")])
def test_the_peers_refuse_in_one_line(layout: str, name: str, tmp_path: Path, monkeypatch) -> None:
    writer = create_writer(name, layout=layout)
    reason = writer.unsupported_reason(torch.device("cpu"), torch.bfloat16, torch.bfloat16)
    assert reason and "\n" not in reason and "CUDA" in reason
    monkeypatch.setenv("KVPROF_VLLM_SRC", str(tmp_path / "nowhere"))
    ext, why = vllm_peers.load_extension()
    assert ext is None and str(tmp_path / "nowhere") in why and "\n" not in why


def test_mla_peer_offers_fp8_only_where_the_casts_agree() -> None:
    writer = create_writer("vllm_concat_and_cache_mla", layout="mla")
    reason = writer.unsupported_reason(torch.device("cuda"), torch.float8_e5m2, torch.bfloat16)
    assert reason and "saturates" in reason
