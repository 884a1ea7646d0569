#!/usr/bin/env bash
# The MLA and paged layouts on one H200, in one call of at most 10 minutes:
#   bash gpu/layouts_bench.sh [steps...]     steps (default: env install tests bench)
# With .whl/ beside the checkout (bash gpu/fetch_sglang_wheels.sh, here, once), SGLang's own
# MLA store (set_mla_kv_buffer_triton: its JIT CUDA kernel on sm_90) is installed and benched
# as the peer; without it that variant is reported unavailable, with the reason.
# Results under $OUT: layouts.txt (the log: table and verdicts), layouts-gpu-tests.txt,
# layouts/bench.json and layouts/bench.csv. Each step is time-boxed.
set -uo pipefail
OUT=${OUT:-/tmp/kvprof-layouts}
mkdir -p "$OUT/layouts"
LOG="$OUT/layouts.txt"
steps=${*:-env install tests bench}
stamp() { echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $*" | tee -a "$LOG"; }
[ -f .gpu/env.sh ] && source .gpu/env.sh
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0

for step in $steps; do
  case $step in
  env)
    stamp env
    { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
      python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
      git log -1 --format='commit %H %s' 2>/dev/null; } 2>&1 | tee -a "$LOG"
    ;;
  install)
    stamp "install: SGLang from .whl/ (for the sglang_mla peer), if present"
    if ls .whl/*.whl >/dev/null 2>&1; then
      timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tail -3 | tee -a "$LOG"
    else
      echo "no .whl/: sglang_mla runs only if SGLang is already installed" | tee -a "$LOG"
    fi
    python3 -c "import sglang.kernels.ops.kvcache.mla_buffer as m; print('SGLang MLA store:', m.__file__)" 2>&1 | tail -1 | tee -a "$LOG"
    ;;
  tests)
    stamp "tests: fused writers bitwise equal to the references on the GPU (every fp8 input value), CUDA graphs"
    timeout ${TESTS_TIMEOUT:-180} python3 -m pytest tests/test_layouts_gpu.py -m gpu -q -p no:cacheprovider \
      2>&1 | tee "$OUT/layouts-gpu-tests.txt" | tail -15 | tee -a "$LOG"
    ;;
  bench)
    stamp "bench: python3 -m kvprof.bench.layouts --layout mla,paged --out \$OUT/layouts"
    timeout ${BENCH_TIMEOUT:-330} python3 -m kvprof.bench.layouts --layout mla,paged --out "$OUT/layouts" 2>&1 \
      | tee -a "$LOG" | tail -60
    ;;
  *)
    echo "unknown step $step" | tee -a "$LOG"
    ;;
  esac
done
stamp done
