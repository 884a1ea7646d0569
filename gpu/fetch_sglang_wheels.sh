#!/usr/bin/env bash
# The wheels gpu/sglang_check.sh installs on the H200 (Python 3.12, x86-64, no network there),
# into .whl/ (git-ignored through .git/info/exclude). The H200 image already has torch 2.11,
# transformers, torchvision, einops, sentencepiece, aiohttp, psutil, pillow, requests, tqdm,
# anyio, httpx; these are what SGLang's pool module imports beyond that, plus kvprof's
# orjson and nvtx.
#
# SGLang's wheel is 39 MB, more than the 64 MiB a device call carries leaves beside the
# repo and the other wheels, so it is repacked without what no KV-pool import reaches (checked
# on CPU with those modules blocked): the Rust server/bench/gRPC/multimodal extensions
# (sglang/srt/rust_extensions/_*.so), the radix-tree core (sglang/srt/mem_cache/rust_tree_core/*.so)
# and the diffusion package (sglang/multimodal_gen/). Every other file is SGLang's, unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo /.whl/ >> "$EXCLUDE"
rm -rf .whl && mkdir -p .whl
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_24_x86_64)
WHEELS=(sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 openai==2.8.0
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        msgspec==0.23.0 pybase64==1.5.1 pyzmq dill==0.4.1 gguf==0.19.0 loguru==0.7.3
        partial-json-parser==0.2.1.1.post7 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 starlette
        ipython==9.18.1 ipython-pygments-lexers decorator jedi parso matplotlib-inline traitlets
        prompt-toolkit wcwidth stack-data executing asttokens pure-eval orjson nvtx ${EXTRA_WHEELS:-})
# (SGLang pins transformers 5.19; its pool module imports with the image's 5.17 too, checked on CPU.)
python3 -m pip download -q --no-deps "${PLAT[@]}" -d .whl "${WHEELS[@]}"
python3 - <<'PY'
import glob, os, re, zipfile
src = glob.glob(".whl/sglang-*.whl")[0]
drop = re.compile(r"^sglang/(srt/rust_extensions/_[^/]+\.so|srt/mem_cache/rust_tree_core/[^/]+\.so|multimodal_gen/)")
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not drop.match(item.filename):
            zout.writestr(item, zin.read(item.filename))
os.replace(tmp, src)
PY
ls -la .whl | awk 'NR>1 {print $5, $9}' | sort -n
du -cb .whl/*.whl | tail -1
