#!/usr/bin/env bash
# Everything kvprof needs a GPU for, in one call on an H200 machine:
#   bash gpu/prepare_carry.sh orjson==3.13.0   # where a registry is reachable, once: fills .gpu/
#   there, with .gpu/ beside the checkout:  source .gpu/env.sh; bash gpu/run_gpu_checks.sh [steps...]
# Steps (default: env capture bench tests): env smoke tests capture settings layer layer-order bench rope
# rope-bench peers verify shadow writer-checks perf1 perf2 vllm-peers dsv4, and the lab probes (lab/README.md) tune floor ablation facts.
# Results go to $OUT; logs are tee'd so a timeout still returns what ran.
set -uo pipefail
OUT=${OUT:-/tmp/kvprof-gpu}
mkdir -p "$OUT"
steps=${*:-env capture bench tests}
# A planted secret: no byte of it may reach any file of the run (reports must not carry
# the user's environment). tests/test_samples.py checks the committed samples.
export KVPROF_TEST_SECRET=kvprof-planted-9c41e7d2b85a
export HF_TOKEN=hf_kvprofPlantedTokenValue0123456789
export KVPROF_CACHE_DIR=${KVPROF_CACHE_DIR:-/tmp/kvprof-cache}
# sgl-kernel's own store kernels, extracted by python -m kvprof.kvcache.writers.sgl_cubin_extract into .gpu/sgl
if [ -z "${KVPROF_SGL_CUBIN:-}" ] && [ -f .gpu/sgl/store_kv_cache.sm_90.cubin ]; then
  export KVPROF_SGL_CUBIN=$PWD/.gpu/sgl/store_kv_cache.sm_90.cubin
fi
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
# SGLANG_PATH: the checkout, then SGLang's wheel installed from .whl into /tmp/site (gpu/sglang_check.sh
# install, once), then gpu/sgl_kernel_stub where sgl-kernel does not import; the checkout alone without .whl
sglang_path() {
  if [ -d .whl ] && [ ! -d /tmp/site/sglang ]; then bash gpu/sglang_check.sh install >/dev/null 2>&1; fi
  SGLANG_PATH=$PWD
  if [ -d /tmp/site/sglang ]; then
    SGLANG_PATH=$SGLANG_PATH:/tmp/site
    PYTHONPATH=$SGLANG_PATH python3 -c "import sgl_kernel" 2>/dev/null || SGLANG_PATH=$SGLANG_PATH:$PWD/gpu/sgl_kernel_stub
  fi
}

for step in $steps; do
  case $step in
  env)
    stamp env
    { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
      python3 - <<'PY'
import torch, triton, platform
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
p = torch.cuda.get_device_properties(0)
print(p.name, p.multi_processor_count, "SMs", p.total_memory >> 20, "MiB", "L2", getattr(p, "L2_cache_size", None))
PY
      "$KVPROF_NSYS" --version; nvcc --version | tail -1; } 2>&1 | tee "$OUT/env.txt"
    ;;
  smoke)
    stamp smoke
    # a small --context layer capture with both profilers: the whole path, in seconds
    rm -rf /tmp/kvprof-smoke
    timeout ${SMOKE_TIMEOUT:-150} python3 -m kvprof capture --model small=4x2x128 --tp 1 --context layer \
      --context-len 256 --variants two_stream,triton_fused --batch-sizes 1,8 --prefill-tokens 128 --steps 3 \
      --reference-steps 20 --profiler both --out /tmp/kvprof-smoke --run-id smoke --no-progress 2>&1 | tee "$OUT/smoke.txt"
    ;;
  tests)
    stamp tests
    # every test marked gpu (more than 290 s on an H100: lab/results/h100-2026-12-06/README.md); -rfs
    # names each failure and skip in the output that comes back
    TRITON_INTERPRET=0 timeout ${TESTS_TIMEOUT:-540} python3 -m pytest tests lab/tests -m gpu -q -rfs \
      -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
    ;;
  tune)
    stamp tune
    # TUNE_PARTS / TUNE_SHAPES / TUNE_DTYPES / TUNE_TOKENS run a subset (lab/tune_fused.py)
    timeout ${TUNE_TIMEOUT:-300} python3 lab/tune_fused.py 2>&1 | tee "$OUT/tune.txt"
    ;;
  ablation)
    stamp ablation
    # the fp8 write at the latency floor with one part of its conversion left out at a time
    timeout ${ABLATION_TIMEOUT:-300} python3 lab/fp8_ablation.py 2>&1 | tee "$OUT/fp8-ablation.txt"
    ;;
  floor)
    stamp floor
    # the same floor-bound points over several pool allocations and graph captures
    timeout ${FLOOR_TIMEOUT:-120} python3 lab/floor_modes.py 2>&1 | tee "$OUT/floor-modes.txt"
    ;;
  facts)
    stamp facts
    # registers, access widths (SASS) and, where ncu may read counters, achieved bandwidth
    timeout ${FACTS_TIMEOUT:-110} python3 lab/kernel_facts.py 2>&1 | tee "$OUT/kernel-facts.txt"
    ;;
  capture)
    stamp capture
    # the samples the tests and the dashboard use: Llama-3.1-70B TP8 decode at batch
    # 1/10/64 with CUDA graphs, and a 4096-token prefill
    rm -rf /tmp/kvprof-traces
    timeout ${CAPTURE_TIMEOUT:-300} python3 -m kvprof capture --model llama-3.1-70b --tp 8 \
      --variants index_put,two_stream,sgl_kernel_cubin,triton_fused,cuda_fused,store_kv_fused --phase decode,prefill \
      --batch-sizes 1,10,64 --prefill-tokens 4096 --steps 3 --warmup 2 --reference-steps 200 \
      --profiler both --out /tmp/kvprof-traces --run-id h200-llama70b-tp8 --no-progress 2>&1 | tee "$OUT/capture.txt"
    ( cd /tmp/kvprof-traces && tar czf "$OUT/samples.tgz" h200-llama70b-tp8 )
    # The .nsys-rep files cannot be scrubbed: export each again, unscrubbed, and look
    # for the planted values in every byte (the committed .sqlite files are scrubbed).
    for rep in /tmp/kvprof-traces/h200-llama70b-tp8/*.nsys-rep; do
      "$KVPROF_NSYS" export --type=sqlite --force-overwrite=true -o /tmp/raw-export.sqlite "$rep" >/dev/null 2>&1
      for f in "$rep" /tmp/raw-export.sqlite; do
        n=$(grep -c -a -e "$KVPROF_TEST_SECRET" -e "$HF_TOKEN" "$f"); echo "planted secret in $(basename "$f") ($(basename "$rep")): $n matching lines"
      done
    done 2>&1 | tee "$OUT/secret-check.txt"
    ;;
  settings)
    stamp settings
    # what the profilers' own settings do to graph replays: the same decode captures with
    # torch.profiler's cuda_sync events off/on and nsys --cuda-graph-trace node/graph; each
    # run times its steps in-pass and in the unprofiled reference (step_timings.json)
    rm -rf /tmp/kvprof-settings
    for s in "node --no-torch-sync-events" "graph --torch-sync-events"; do
      set -- $s
      timeout ${SETTINGS_TIMEOUT:-150} python3 -m kvprof capture --variants two_stream,triton_fused,cuda_fused \
        --phase decode --batch-sizes 1,10,64 --steps 10 --reference-steps 100 --profiler both \
        --nsys-graph-trace "$1" "$2" --out /tmp/kvprof-settings --run-id "nsys-$1" --no-progress \
        2>&1 | tee "$OUT/settings-$1.txt"
    done
    ( cd /tmp/kvprof-settings && tar czf "$OUT/settings.tgz" */summary.json */step_timings.json */manifest.json )
    ;;
  layer)
    stamp layer
    # every write inside a Llama-3.1-70B TP8 decoder layer (per-rank GEMMs, Llama-3.1's rotary in
    # place on the QKV output's q and k views, SGLang's Triton decode attention over 4096 cached
    # tokens per request plus the new one), decode at batch 1/10/64 from CUDA graphs; the rope
    # variants replace the rotary and the store. SGLang's attention needs SGLang: installed from
    # .whl into /tmp/site as the rope step does (checkout first on the path); without it the
    # capture says so and runs torch SDPA (the manifest's config.resolved.layer says which ran).
    sglang_path
    rm -rf /tmp/kvprof-layer
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${LAYER_TIMEOUT:-480} \
      python3 -m kvprof capture --model llama-3.1-70b --tp 8 --context layer --context-len 4096 \
      --variants ${LAYER_VARIANTS:-two_stream,triton_fused,sgl_kernel_cubin,rope_then_triton_fused,rope_triton_fused} \
      --phase decode --batch-sizes 1,10,64 --steps 5 --warmup 2 --reference-steps 60 --profiler both \
      --out /tmp/kvprof-layer --run-id h200-llama70b-tp8-layer --no-progress 2>&1 | tee "$OUT/layer.txt"
    # the layer's kernels as recorded, the savings, where the writes sit in the traces, the gap notes
    python3 - /tmp/kvprof-layer/h200-llama70b-tp8-layer 2>&1 <<'PY' | tee "$OUT/layer-steps.txt"
import sys
from pathlib import Path

import orjson

from kvprof.report.layer_steps import render_layer_steps
from kvprof.report.terminal import make_console

run = Path(sys.argv[1])
print("layer kernels:", orjson.loads((run / "manifest.json").read_bytes())["config"]["resolved"].get("layer"))
render_layer_steps(orjson.loads((run / "summary.json").read_bytes()).get("layer_steps"), make_console())
PY
    ( cd /tmp/kvprof-layer && tar czf "$OUT/layer.tgz" h200-llama70b-tp8-layer )
    ;;
  layer-order)
    stamp layer-order
    # is what a write adds to the batch-1 layer step a property of the write or of when its variant
    # ran? The same --context layer capture at batch 1, its variants in one order and then in the
    # reverse order, each run in its own process (LAYER_ORDER_VARIANTS sets the first order)
    sglang_path
    forward=${LAYER_ORDER_VARIANTS:-two_stream,sgl_kernel_cubin,triton_fused,store_kv_fused,rope_then_triton_fused,rope_triton_fused}
    reverse=$(echo "$forward" | tr , '\n' | tac | paste -sd, -)
    rm -rf /tmp/kvprof-layer-order
    for order in forward reverse; do
      [ $order = forward ] && variants=$forward || variants=$reverse
      echo "order $order: $variants" | tee -a "$OUT/layer-order.txt"
      PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${LAYER_ORDER_TIMEOUT:-200} \
        python3 -m kvprof capture --model llama-3.1-70b --tp 8 --context layer --context-len 4096 \
        --variants "$variants" --phase decode --batch-sizes 1 --steps 5 --warmup 2 --reference-steps 60 \
        --profiler torch --out /tmp/kvprof-layer-order --run-id "$order" --no-progress 2>&1 | tee -a "$OUT/layer-order.txt"
    done
    ( cd /tmp/kvprof-layer-order && tar czf "$OUT/layer-order.tgz" */manifest.json */summary.json */step_timings.json )
    ;;
  perf2)
    stamp perf2
    # (1) what a write itself adds to the Llama-3.1-70B TP8 decoder layer (batch 1/10/64, CUDA graphs,
    # PDL where the writer launches with it), apart from its neighbours' run-to-run variation: the
    # variants in rotated orders, both graphs (with and without the write) timed by CUDA events and
    # traced, per-kernel medians of the other kernels compared (lab/layer_own_time.py); bf16 and fp8
    # caches, so that (2) the fused quantising writes' saving against SGLang's own set_kv_buffer
    # (div_ in place, .to, .view, store_cache) is set against what its conversion costs.
    # (3) bench's fp8 points of the decode row shape beside SGLang's writes; (4) the same in a capture.
    # Hard limits: 270 + 60 + 80 s after SGLang's install from .whl (first call on a fresh machine).
    sglang_path
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 OUT=$OUT timeout ${PERF2_OWN_TIMEOUT:-270} \
      python3 lab/layer_own_time.py --budget-s ${PERF2_OWN_BUDGET:-210} ${PERF2_OWN_ARGS:-} 2>&1 | tee "$OUT/layer-own-time.txt"
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${PERF2_BENCH_TIMEOUT:-60} python3 -m kvprof bench \
      --variants triton_fused,store_kv_fused,cuda_fused,sglang_store_cache,sglang_set_kv_buffer,set_kv_buffer_torch \
      --modes graph --shapes 1x128 --dtypes 'fp8_e4m3<-bf16' --tokens 1,10,64 --out "$OUT/bench-fp8" 2>&1 \
      | tee "$OUT/bench-fp8.txt"
    rm -rf /tmp/kvprof-perf2
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${PERF2_CAPTURE_TIMEOUT:-80} \
      python3 -m kvprof capture --model llama-3.1-70b --tp 8 --context layer --context-len 4096 \
      --cache-dtype fp8_e4m3 --k-scale 0.5 --v-scale 0.5 --variants sglang_set_kv_buffer,triton_fused \
      --phase decode --batch-sizes 1,10,64 --steps 3 --warmup 2 --reference-steps 30 --profiler torch \
      --out /tmp/kvprof-perf2 --run-id fp8-layer --no-progress 2>&1 | tee "$OUT/capture-fp8-layer.txt"
    ( cd /tmp/kvprof-perf2 2>/dev/null && tar czf "$OUT/capture-fp8-layer.tgz" */manifest.json */summary.json */step_timings.json )
    ;;
  bench)
    stamp bench
    # BENCH_ARGS narrows the grid (e.g. --variants cuda_fused --tokens 1,64) for a quick look
    timeout ${BENCH_TIMEOUT:-170} python3 -m kvprof bench --eager-repeats 10 ${BENCH_ARGS:-} --out "$OUT/bench" 2>&1 | tee "$OUT/bench.txt"
    ;;
  rope)
    stamp rope
    # the rope + K/V store writers against the float32 reference, then 80 layers of Llama-3.1-70B
    # TP8 from CUDA graphs (lab/rope_bench.py). SGLang's peers need SGLang: installed from .whl
    # (gpu/fetch_sglang_wheels.sh) into /tmp/site as gpu/sglang_check.sh does, after the checkout
    # on the path; without it they are skipped with their reason.
    sglang_path
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${ROPE_TESTS_TIMEOUT:-330} \
      python3 -m pytest tests/test_rope_gpu.py tests/test_rope_writers.py -m gpu -q -p no:cacheprovider -rs ${ROPE_TESTS_ARGS:-} 2>&1 \
      | tee "$OUT/rope-tests.txt"
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} timeout ${ROPE_BENCH_TIMEOUT:-200} python3 lab/rope_bench.py 2>&1 \
      | tee "$OUT/rope-bench.txt"
    ;;
  rope-bench)
    stamp rope-bench
    # rope + store (docs/layouts.md): the one-launch rope_triton_fused beside the same rotary
    # kernel followed by kvprof's fused store or SGLang's two-stream store; the kernel's SASS
    # first (FFMA must be 0), then the bench's rope family and a capture with both profilers
    python3 gpu/rope_sass_offline.py 2>&1 | tee "$OUT/rope-sass.txt"
    timeout ${ROPE_KVPROF_BENCH_TIMEOUT:-300} python3 -m kvprof bench --family rope --eager-repeats 10 ${ROPE_KVPROF_BENCH_ARGS:-} \
      --out "$OUT/bench-rope" 2>&1 | tee "$OUT/bench-rope.txt"
    rm -rf /tmp/kvprof-rope
    timeout ${ROPE_CAPTURE_TIMEOUT:-300} python3 -m kvprof capture --model llama-3.1-70b --tp 8 \
      --variants rope_then_two_stream,rope_then_triton_fused,rope_triton_fused --phase decode,prefill \
      --batch-sizes 1,10,64 --prefill-tokens 4096 --steps 3 --warmup 2 --reference-steps 200 \
      --profiler both --out /tmp/kvprof-rope --run-id h200-llama70b-tp8-rope --no-progress 2>&1 | tee "$OUT/capture-rope.txt"
    ;;
  peers)
    stamp peers
    # kvprof's fused stores (PDL) against SGLang's JIT store_cache (PDL) at every bench point:
    # CUDA-graph replays and one write after an L2 flush; then the launch shapes of the
    # 32x128 bandwidth-bound points timed beside store_cache (lab/tune_fused.py); then the
    # rotary alone, kvprof's against SGLang's apply_rope_inplace (lab/rope_bench.py).
    sglang_path
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} timeout ${PEERS_BENCH_TIMEOUT:-300} python3 -m kvprof bench \
      --variants ${PEERS_VARIANTS:-triton_fused,store_kv_fused,cuda_fused,sglang_store_cache} --modes graph,cold \
      --dtypes ${PEERS_DTYPES:-bf16,fp8_e4m3<-bf16} ${PEERS_ARGS:-} --out "$OUT/bench-peers" 2>&1 | tee "$OUT/bench-peers.txt"
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TUNE_PARTS=tune TUNE_SHAPES=32x128 TUNE_DTYPES=bf16 \
      TUNE_TOKENS=${PEERS_TUNE_TOKENS:-4096,32768} TUNE_CAPTURES=3 TUNE_PEERS=sglang_store_cache \
      timeout ${PEERS_TUNE_TIMEOUT:-150} python3 lab/tune_fused.py 2>&1 | tee "$OUT/tune-peers.txt"
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} ROPE_VARIANTS=${PEERS_ROPE_VARIANTS:-rotary:kvprof,rotary:sglang,rope_triton_fused} \
      ROPE_JSON=rotary-bench.json timeout ${PEERS_ROPE_TIMEOUT:-120} python3 lab/rope_bench.py 2>&1 \
      | tee "$OUT/rotary-bench.txt"
    ;;
  verify)
    stamp verify
    # kvprof verify (docs/verify.md): every registered writer that runs on the GPU against its
    # layout's reference, compiled kernels (Triton, CUDA, SGLang's JIT and sgl-kernel's where
    # they install), a budget of 5 minutes; the JSON document beside the table
    sglang_path
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${VERIFY_TIMEOUT:-420} \
      python3 -m kvprof verify --device cuda --budget ${VERIFY_BUDGET:-300} --seed ${VERIFY_SEED:-0} ${VERIFY_ARGS:-} \
      2>&1 | tee "$OUT/verify.txt"
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout 120 python3 -m kvprof verify \
      --device cuda --budget 60 --cases 16 --seed 1 --format json > "$OUT/verify-seed1.json" 2> "$OUT/verify-seed1.txt"
    echo "verify seed 1: exit $?" | tee -a "$OUT/verify-seed1.txt"
    # PDL visibility: after each write of every writer that launches with PDL (or whose library
    # decides: SGLang's store_cache and apply_rope_inplace_with_kvcache, through SGLang's API), a
    # kernel launched with PDL reads the rows just written after its griddepcontrol.wait; stale
    # reads counted over 256 writes at each of 1, 7, 64, 512, 4096 tokens (>= 1.2e6 reads a writer)
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${VERIFY_PDL_TIMEOUT:-420} \
      python3 -m kvprof verify --pdl --device cuda --trials ${VERIFY_PDL_TRIALS:-256} --format json \
      > "$OUT/verify-pdl.json" 2> "$OUT/verify-pdl.txt"
    echo "verify --pdl: exit $?" | tee -a "$OUT/verify-pdl.txt"
    cat "$OUT/verify-pdl.txt"
    ;;
  shadow)
    stamp shadow
    # the engine plugins' shadow check on the GPU: its tests (no host sync at the write, writes
    # captured into a CUDA graph checked at every replay) and its cost at N = 100, 10, 1 per eager
    # hooked write and inside a CUDA graph of 80 writes (benchmarks/bench_shadow.py); SGLang's
    # pool from its wheel where carried
    sglang_path
    { PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${SHADOW_TIMEOUT:-150} \
        python3 -m pytest tests/test_shadow.py -m gpu -q -p no:cacheprovider
      PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout ${SHADOW_TIMEOUT:-150} \
        python3 benchmarks/bench_shadow.py --device cuda ${SHADOW_ARGS:-}; } 2>&1 | tee "$OUT/shadow.txt"
    ;;
  writer-checks)
    stamp writer-checks
    # the host cost per call of the checks every writer runs on its own calls, on the GPU and
    # on this host's CPU (benchmarks/bench_writer_checks.py); the GPU cases of the direct calls
    # are in the tests step (tests/test_writer_contracts.py -m gpu)
    { timeout ${WRITER_CHECKS_TIMEOUT:-150} python3 benchmarks/bench_writer_checks.py --device cuda
      timeout ${WRITER_CHECKS_TIMEOUT:-150} python3 benchmarks/bench_writer_checks.py --device cpu; } 2>&1 \
      | tee "$OUT/writer-checks.txt"
    ;;
  perf1)
    stamp perf1
    # Launch tables per card and eager launches, within PERF1_BUDGET (480) s on one card:
    # 1. the compiled launcher's and the card tables' GPU tests (same bytes with the launcher on
    #    and off, the kept kernel is Triton's own, graph capture of the compiled path);
    # 2. kvprof bench's eager mode for every fused writer (store, rope + store, MLA and paged), then
    #    the Triton writers again with KVPROF_TRITON_LAUNCHER=0 (Triton's own launch path) to compare;
    # 3. rope + store at 4096 tokens: the table's launch shape beside candidates (lab/rope_bench.py);
    # 4. lab/tune_cards.py with the seconds left: every candidate launch shape at the grid points the
    #    tables decide (32x128 first), the rows to commit for this card, and kvprof's best and its
    #    table's shape against SGLang's JIT store_cache, graph replays and after an L2 flush.
    # PERF1_PARTS picks parts (default: tests eager rope-4096 cards); a name not among them is refused
    p1_parts=" ${PERF1_PARTS:-tests eager rope-4096 cards} "
    p1_bad=$(for part in $p1_parts; do case $part in tests|eager|rope-4096|cards) ;; *) echo "$part" ;; esac; done)
    if [ -n "$p1_bad" ]; then
      echo "perf1: unknown PERF1_PARTS $(echo $p1_bad) (known: tests eager rope-4096 cards)" | tee -a "$OUT/perf1.txt" >&2
      bad_input=1
      continue
    fi
    sglang_path
    p1_start=$SECONDS
    p1_budget=${PERF1_BUDGET:-480}
    p1_left() { echo $(( p1_budget - (SECONDS - p1_start) )); }
    p1_run() {  # p1_run PART SECONDS NAME CMD...: at most SECONDS (and never past the budget), output to $OUT/NAME.txt
      case $p1_parts in *" $1 "*) ;; *) return ;; esac
      local limit=$2 name=$3; shift 3
      local left; left=$(( $(p1_left) - 5 ))
      [ "$left" -lt "$limit" ] && limit=$left
      if [ "$limit" -lt 10 ]; then echo "perf1: no time left for $name" | tee -a "$OUT/perf1.txt"; return; fi
      echo "== $(date -u +%H:%M:%S) $name (limit ${limit}s): $*" | tee -a "$OUT/perf1.txt"
      PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET=0 timeout -k 5 "$limit" "$@" > "$OUT/$name.txt" 2>&1
      echo "   exit $? after $(( SECONDS - p1_start ))s" | tee -a "$OUT/perf1.txt"
    }
    p1_run tests 60 perf1-tests python3 -m pytest tests/test_triton_launch.py tests/test_card_tables.py -m gpu -q \
      -p no:cacheprovider -rs
    p1_run eager 55 perf1-eager-store python3 -m kvprof bench --modes eager \
      --variants index_put,triton_fused,cuda_fused,store_kv_fused --shapes 8x128 --dtypes "bf16,fp8_e4m3<-bf16" \
      --tokens 1,64,4096 --eager-repeats 20 --out "$OUT/perf1-eager-store"
    p1_run eager 55 perf1-eager-rope python3 -m kvprof bench --family rope --modes eager \
      --variants rope_then_triton_fused,rope_triton_fused,rope_cuda_fused --shapes 8x1x128 --dtypes bf16 \
      --tokens 1,64,4096 --eager-repeats 20 --out "$OUT/perf1-eager-rope"
    p1_run eager 60 perf1-eager-layouts python3 -m kvprof.bench.layouts --tokens 1,64 --replays 20 \
      --out "$OUT/perf1-eager-layouts"
    p1_run eager 30 perf1-eager-store-jit env KVPROF_TRITON_LAUNCHER=0 python3 -m kvprof bench --modes eager \
      --variants triton_fused --shapes 8x128 --dtypes bf16 --tokens 1,4096 --eager-repeats 20 \
      --out "$OUT/perf1-eager-store-jit"
    p1_run eager 30 perf1-eager-rope-jit env KVPROF_TRITON_LAUNCHER=0 python3 -m kvprof bench --family rope --modes eager \
      --variants rope_triton_fused --shapes 8x1x128 --dtypes bf16 --tokens 1,4096 --eager-repeats 20 \
      --out "$OUT/perf1-eager-rope-jit"
    # rope + store at 4096 tokens (Llama-3.1-70B TP8 per rank, 80 layers from CUDA graphs): the table's
    # shape beside candidate prefill shapes (block_t.block_h.warps), to bring it toward its copy floor
    p1_run rope-4096 70 perf1-rope-4096 env ROPE_TOKENS=4096 ROPE_CAPTURES=3 ROPE_JSON=perf1-rope-4096.json OUT="$OUT" \
      ROPE_VARIANTS=rope_triton_fused,rope_triton_fused@2.1.2,rope_triton_fused@4.1.2,rope_triton_fused@4.1.4,\
rope_triton_fused@8.1.4,rope_triton_fused@8.1.8,rope_triton_fused@16.1.4,rope_triton_fused@16.1.16,\
rope_triton_fused@32.1.8,rope_triton_fused@32.1.16,rope_triton_fused@8.2.8,rope_triton_fused@16.2.8 \
      python3 lab/rope_bench.py
    # the sweep gets what is left; it starts no point after CARDS_BUDGET_S and rewrites its JSON after each
    p1_sweep=$(( $(p1_left) - 10 ))
    p1_run cards "$p1_sweep" perf1-cards env CARDS_BUDGET_S="${CARDS_BUDGET_S:-$(( p1_sweep - 45 ))}" OUT="$OUT" \
      python3 lab/tune_cards.py
    cat "$OUT/perf1.txt"
    ;;
  vllm-peers)
    stamp vllm-peers
    # vLLM's reshape_and_cache_flash and concat_and_cache_mla kernels, compiled from vLLM's source
    # (extracted here into .gpu/vllm: python -m kvprof.kvcache.writers.vllm_src_extract VLLM_SRC),
    # against kvprof's paged and MLA writers: build, bench (graph replays and cold, each point
    # checked bitwise against the reference first), verify, GPU tests. At most ~470 s.
    D=$OUT/vllm-peers; mkdir -p "$D"
    export KVPROF_VLLM_SRC=${KVPROF_VLLM_SRC:-$PWD/.gpu/vllm} TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/kvprof-ext}
    cp "$KVPROF_VLLM_SRC/SOURCE.json" "$D/vllm-source.json" 2>/dev/null || echo "no $KVPROF_VLLM_SRC/SOURCE.json" | tee "$D/build.txt"
    # the two ops build at once (vLLM's kernels; kvprof's layout_store for paged_cuda/mla_cuda)
    for mod in vllm_peers layout_cuda; do
      timeout ${BUILD_TIMEOUT:-170} python3 -c "
import time; t = time.time()
from kvprof.kvcache.writers.$mod import load_extension
m, e = load_extension(); print('$mod build', round(time.time() - t, 1), 's:', e or 'ok')
raise SystemExit(1 if e else 0)" > "$D/build-$mod.txt" 2>&1 &
    done
    wait
    cat "$D"/build-*.txt
    cp "$TORCH_EXTENSIONS_DIR"/kvprof_vllm_peers_*/build.log "$D/build-vllm_peers.log" 2>/dev/null
    timeout ${BENCH_TIMEOUT:-210} python3 -m kvprof.bench.layouts --layout paged,mla --modes graph,cold --replays 40 \
      --variants paged_triton,paged_cuda,vllm_reshape_and_cache_flash,mla_triton,mla_cuda,vllm_concat_and_cache_mla \
      --out "$D/bench" 2>&1 | tee "$D/bench.txt" | tail -40
    timeout ${VERIFY_TIMEOUT:-45} python3 -m kvprof verify --variants vllm_reshape_and_cache_flash,vllm_concat_and_cache_mla \
      --device cuda --budget 30 2>&1 | tee "$D/verify.txt" | tail -12
    TRITON_INTERPRET=0 timeout ${TESTS_TIMEOUT:-60} python3 -m pytest tests/test_layouts_gpu.py -m gpu -q -rs -x \
      -p no:cacheprovider -k vllm 2>&1 | tee "$D/gpu-tests.txt" | tail -8
    ;;
  dsv4)
    stamp dsv4
    # DeepSeek-V4's pool setters with SGLang's own JIT kernels (gpu/sglang_dsv4.py, SGLang from its
    # wheel): the plugin's path counts, CUDA graph record and ledger, and analyze tying each replayed
    # write to the kernel the record names; PASS/FAIL lines, exit 1 on a FAIL
    sglang_path
    PYTHONPATH=$SGLANG_PATH${PYTHONPATH:+:$PYTHONPATH} SGLANG_PLUGINS=kvprof TRITON_INTERPRET=0 \
      timeout ${DSV4_TIMEOUT:-300} python3 gpu/sglang_dsv4.py --out "$OUT/dsv4" 2>&1 | tee "$OUT/dsv4.txt"
    echo "dsv4: exit ${PIPESTATUS[0]}" | tee -a "$OUT/dsv4.txt"
    ;;
  *) echo "unknown step $step" >&2; bad_input=1 ;;
  esac
done
stamp done
exit $(( ${bad_input:-0} * 2 ))  # an unknown step or part: exit 2 after the rest ran
