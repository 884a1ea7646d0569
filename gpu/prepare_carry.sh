#!/usr/bin/env bash
# Prepare .gpu/ in the project root: what a GPU machine without a package registry lacks for kvprof.
#   - the nvtx wheel (Python 3.12, x86-64), so NVTX ranges are real there
#   - libdw.so.1 / libelf.so.1 from Debian's libdw1 and libelf1, so the
#     Nsight Systems importer there can turn a capture into a .nsys-rep
# Usage (from the project root):  bash gpu/prepare_carry.sh [more wheels...]
# Copy .gpu/ to that machine with the checkout, and start each command there with
#   source .gpu/env.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
mkdir -p .gpu/whl .gpu/lib
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu/whl nvtx==0.2.16 "$@"
tmp=$(mktemp -d)
( cd "$tmp" && apt-get download -q libdw1 libelf1 >/dev/null 2>&1 || { apt-get update -qq && apt-get download -q libdw1 libelf1; } )
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/x"; done
# real files, not links: links travel as links
for so in libdw.so.1 libelf.so.1; do cp -L "$tmp/x/usr/lib/x86_64-linux-gnu/$so" .gpu/lib/$so; done
rm -rf "$tmp"
cat > .gpu/env.sh <<'SH'
# source this at the start of a device command
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KVPROF_NSYS=${KVPROF_NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
export PYTHONUNBUFFERED=1
SH
du -sh .gpu; ls .gpu/whl .gpu/lib
