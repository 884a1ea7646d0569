"""Take the device code of vLLM's ``reshape_and_cache_flash`` and ``concat_and_cache_mla`` out
of a vLLM source tree (an unpacked sdist), for the ``vllm_*`` peer writers to compile.

Nothing of vLLM is part of kvprof: this copies, into a folder of the user's (default
``.gpu/vllm``), vLLM's licence, the headers the two kernels need (verbatim, their paths under
``csrc/`` kept) and ``vllm_cache_kernels.cuh``: the text of ``CopyWithScaleOp``,
``reshape_and_cache_flash_kernel`` and ``concat_and_cache_mla_kernel`` cut verbatim out of
``csrc/cache_kernels.cu``, plus one derived kernel, ``concat_and_cache_mla_skip_kernel``:
the MLA kernel with one more argument, a slot it never writes (SGLang's reserved slot 0,
which vLLM's kernel has no notion of; -1 gives vLLM's behaviour). ``SOURCE.json`` records the
version and the sha256 of every file taken. Left out of cache_kernels.cu: every other kernel
and vLLM's host functions (torch stable-ABI); kvprof's op (``csrc/vllm_peers.cu``) launches
the kernels with vLLM's grid and block.

    python -m kvprof.kvcache.writers.vllm_src_extract VLLM_SRC_DIR [--out .gpu/vllm]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from kvprof.core.errors import UsageError

HEADERS = (
    "quantization/vectorization_utils.cuh",
    "quantization/vectorization.cuh",
    "quantization/w8a8/fp8/nvidia/quant_utils.cuh",
    "core/vec_dtypes/vec_dtypes.h",
    "core/vec_dtypes/dtype_generic.cuh",
    "core/vec_dtypes/dtype_float16.cuh",
    "core/vec_dtypes/dtype_float32.cuh",
    "core/vec_dtypes/dtype_bfloat16.cuh",
    "core/vec_dtypes/dtype_fp8.cuh",
)
PIECES = ("struct CopyWithScaleOp", "void reshape_and_cache_flash_kernel(", "void concat_and_cache_mla_kernel(")
GENERATED = "vllm_cache_kernels.cuh"
SKIP_SIGNATURE = ("    const float* scale                         //\n) {",
                  "    const float* scale,                        //\n    const int64_t kvprof_skip_slot\n) {")
SKIP_TEST = ("  if (slot_idx < 0) {", "  if (slot_idx < 0 || slot_idx == kvprof_skip_slot) {")


def cut(text: str, marker: str) -> str:
    """The declaration holding ``marker``: from its ``template`` line to its closing brace
    (``};`` for a struct), braces counted."""
    at = text.find(marker)
    if at < 0 or text.find(marker, at + 1) >= 0:
        raise UsageError(f"cache_kernels.cu has {'no' if at < 0 else 'more than one'} {marker!r}: "
                         "not a vLLM version this extractor knows")
    start = text.rfind("template <", 0, at)
    open_at = text.find("{", at)
    depth, i = 0, open_at
    while True:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    end = i + 1
    if text[end:end + 1] == ";":
        end += 1
    return text[start:end]


def skip_variant(kernel: str) -> str:
    """The MLA kernel with a slot it never writes (one argument and one comparison added)."""
    out = kernel.replace("concat_and_cache_mla_kernel(", "concat_and_cache_mla_skip_kernel(")
    for old, new in (SKIP_SIGNATURE, SKIP_TEST):
        if out.count(old) != 1:
            raise UsageError(f"concat_and_cache_mla_kernel does not read as expected ({old.strip()!r}): "
                             "not a vLLM version this extractor knows")
        out = out.replace(old, new)
    return out


def version_of(root: Path) -> str:
    for line in (root / "PKG-INFO").read_text(errors="replace").splitlines() if (root / "PKG-INFO").exists() else ():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def extract(root: Path, out: Path) -> dict[str, object]:
    csrc = root / "csrc"
    source = csrc / "cache_kernels.cu"
    if not source.is_file():
        raise UsageError(f"{root} is not a vLLM source tree (no csrc/cache_kernels.cu)")
    missing = [h for h in HEADERS if not (csrc / h).is_file()]
    if missing or not (root / "LICENSE").is_file():
        raise UsageError(f"{root} lacks {', '.join(missing) or 'LICENSE'}: not a vLLM version this extractor knows")
    text = source.read_text()
    pieces = [cut(text, m) for m in PIECES]
    pieces.append(skip_variant(pieces[2]))
    files = {"LICENSE": root / "LICENSE", "csrc/cache_kernels.cu": source,
             **{f"csrc/{h}": csrc / h for h in HEADERS}}
    version = version_of(root)
    sha = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in files.items()}
    info: dict[str, object] = {"vllm_version": version, "sha256": sha}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "include").mkdir(parents=True)
    shutil.copyfile(root / "LICENSE", tmp / "LICENSE")
    for h in HEADERS:
        (tmp / "include" / h).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(csrc / h, tmp / "include" / h)
    head = (f"// Taken from vLLM {version} (https://github.com/vllm-project/vllm), csrc/cache_kernels.cu\n"
            f"// (sha256 {sha['csrc/cache_kernels.cu']}), by kvprof's vllm_src_extract.\n"
            "// Copyright contributors to the vLLM project. Licensed under the Apache License, Version 2.0\n"
            "// (see LICENSE beside this file). The first three declarations are verbatim; the last is\n"
            "// concat_and_cache_mla_kernel with one argument added, a slot it never writes.\n"
            "#pragma once\n#include <cuda.h>\n#include <cuda_bf16.h>\n#include <string>\n"
            "#include \"quantization/vectorization_utils.cuh\"\n"
            "#include \"quantization/w8a8/fp8/nvidia/quant_utils.cuh\"\n\nnamespace vllm {\n\n")
    (tmp / "include" / GENERATED).write_text(head + "\n\n".join(pieces) + "\n\n}  // namespace vllm\n")
    (tmp / "SOURCE.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvprof.kvcache.writers.vllm_src_extract",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a vLLM source tree (unpacked sdist)")
    ap.add_argument("--out", default=".gpu/vllm")
    args = ap.parse_args(argv)
    try:
        info = extract(Path(args.source), Path(args.out))
    except (UsageError, OSError) as exc:
        print(f"kvprof: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print(f"vLLM {info['vllm_version']} kernels in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
