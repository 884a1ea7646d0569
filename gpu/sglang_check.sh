#!/usr/bin/env bash
# kvprof inside SGLang's real package on one H200, in one call of at most 10 minutes:
#   on a machine with network, once:   bash gpu/fetch_sglang_wheels.sh   (fills .whl/, ~34 MB; see that script)
#   on the GPU machine, with .whl beside the checkout (and .gpu from gpu/prepare_carry.sh for nsys):
#     bash gpu/sglang_check.sh [steps...]     steps (default all): install pool live rope nsys bench
# Results under $OUT: sglang-check.txt (the log), sglang-results.tgz (traces, sidecars,
# kvprof analyze outputs, bench.json/csv). Each step is time-boxed so a slow one still
# leaves the others' results.
set -uo pipefail
OUT=${OUT:-/tmp/kvprof-sglang}
mkdir -p "$OUT"
LOG="$OUT/sglang-check.txt"
WORK=/tmp/kvprof-sglang-work
mkdir -p "$WORK"
steps=${*:-install pool live rope nsys bench}
stamp() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
[ -f .gpu/env.sh ] && source .gpu/env.sh
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 SGLANG_PLUGINS=kvprof
# sgl-kernel (a ~535 MB wheel) is not carried: where it does not import, a stub whose every
# function raises stands in (gpu/sgl_kernel_stub), so SGLang's quantization modules import.
if ! python3 -c "import sgl_kernel" 2>/dev/null; then
  export PYTHONPATH=$PWD/gpu/sgl_kernel_stub:$PYTHONPATH
  echo "sgl-kernel does not import here: gpu/sgl_kernel_stub stands in (any call to it raises)" | tee -a "$LOG"
fi
NSYS=${KVPROF_NSYS:-$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)}

for step in $steps; do
  case $step in
  install)
    stamp install
    { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . \
      && python3 - <<'PY'
import importlib.metadata as md, torch, transformers, torchvision
print("sglang", md.version("sglang"), "torch", torch.__version__, "transformers", transformers.__version__,
      "torchvision", torchvision.__version__, "gpu", torch.cuda.get_device_name(0))
print("entry points:", [e.value for e in md.entry_points(group="sglang.srt.plugins")])
import sglang.srt.mem_cache.memory_pool  # noqa: F401
PY
    } 2>&1 | tee -a "$LOG"
    ;;
  pool)
    stamp "pool: SGLang's own store_cache, then KVPROF_SGLANG_WRITER=triton_fused, under torch.profiler"
    for w in sglang triton_fused; do
      d="$WORK/torch-$w"; rm -rf "$d"; mkdir -p "$d"
      ( [ "$w" = sglang ] || export KVPROF_SGLANG_WRITER=$w
        timeout 150 python3 gpu/sglang_pool.py --out "$d" --profiler torch ) 2>&1 | tee -a "$LOG"
      timeout 60 python3 -m kvprof analyze "$d" --out "$d/analysis" 2>&1 | tee -a "$LOG"
    done
    ;;
  live)
    stamp "live: the plugin's device record (peak and its source) and its CUDA-graph record, graph-replayed writes tied to writes by analyze (gpu/sglang_live_check.py)"
    for w in sglang triton_fused; do
      d="$WORK/live-$w"; rm -rf "$d"; mkdir -p "$d"
      ( [ "$w" = sglang ] || export KVPROF_SGLANG_WRITER=$w
        timeout 150 python3 gpu/sglang_pool.py --out "$d" --profiler torch ) 2>&1 | tee -a "$LOG"
      timeout 60 python3 -m kvprof analyze "$d" --out "$d/analysis" 2>&1 | tee -a "$LOG"
      timeout 60 python3 gpu/sglang_live_check.py "$d" 2>&1 | tee -a "$LOG"
      echo "live ($w) check exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
    done
    ;;
  rope)
    stamp "rope: a fused-rope model's writes (SGLang's CUDA rotary embedding with FusedSetKVBufferArg), SGLang's own, then KVPROF_SGLANG_WRITER=rope_triton_fused"
    for w in sglang rope_triton_fused; do
      d="$WORK/rope-$w"; rm -rf "$d"; mkdir -p "$d"
      ( [ "$w" = sglang ] || export KVPROF_SGLANG_WRITER=$w
        timeout 240 python3 gpu/sglang_pool.py --path rope --out "$d" ) 2>&1 | tee -a "$LOG"
      echo "rope ($w) exit: ${PIPESTATUS[0]}" | tee -a "$LOG"
      timeout 60 python3 -m kvprof analyze "$d" --out "$d/analysis" 2>&1 | tee -a "$LOG"
    done
    ;;
  nsys)
    stamp "nsys: graph capture and replays, node-level graph trace"
    if [ -z "$NSYS" ]; then echo "no nsys found (set KVPROF_NSYS)" | tee -a "$LOG"; continue; fi
    d="$WORK/nsys"; rm -rf "$d"; mkdir -p "$d"
    # kvprof nsys: the script gets kvprof's allow-listed environment only (a report keeps the
    # environment it ran with), nsys runs in its own PID namespace, and the export is scrubbed
    KVPROF_NSYS=$NSYS timeout 200 python3 -m kvprof nsys --out "$d/sglang-pool-TP-0" --pass-env SGLANG_PLUGINS \
      -- python3 gpu/sglang_pool.py --out "$d" --profiler none 2>&1 | tee -a "$LOG"
    timeout 120 python3 -m kvprof analyze "$d" --out "$d/analysis" 2>&1 | tee -a "$LOG"
    ;;
  bench)
    stamp "bench: SGLang's store_cache beside sgl-kernel's kernels and kvprof's fused writers"
    # store_cache compiles per row width at first use (nvcc through apache-tvm-ffi): the bench
    # grid's widths first, timed, so the bench itself measures only runs
    timeout 300 python3 - <<'PY' 2>&1 | tee -a "$LOG"
import time
from sglang.kernels.ops.kvcache.kvcache import can_use_store_cache
for rb in (128, 256, 1024, 2048, 4096, 8192):
    t = time.perf_counter(); ok = can_use_store_cache(rb, rb)
    print(f"store_cache {rb} B rows: {ok} ({time.perf_counter() - t:.1f} s)", flush=True)
PY
    timeout ${BENCH_TIMEOUT:-240} python3 -m kvprof bench \
      --variants index_put,two_stream,sgl_kernel_cubin,sglang_store_cache,triton_fused,store_kv_fused \
      --eager-repeats 10 ${BENCH_ARGS:-} --out "$WORK/bench" 2>&1 | tee -a "$LOG"
    ;;
  *) echo "unknown step $step" | tee -a "$LOG" ;;
  esac
done
stamp done
# only kvprof's outputs, the sidecars and the traces travel back (one archive)
( cd "$WORK" && find . \( -name '*.nsys-rep' -o -name '*.sqlite' \) -size +12M -delete; tar czf "$OUT/sglang-results.tgz" . )
ls -la "$OUT"
