#!/usr/bin/env bash
# The per-card tables of docs/benchmarks.md, docs/results.md and docs/layouts.md on one card, in one
# call within CARD_BUDGET seconds (default 560): each part gets at most its own limit and never runs
# past the budget; what a part wrote before its limit stays.
#   source .gpu/env.sh; OUT=/tmp/out bash gpu/card_tables.sh [parts...]
# Parts, run in this order whatever order they are named in (default: env peers-32 peers-1-8 own rope-4096):
#   env        the card and versions
#   tests      the GPU tests of the compiled Triton launcher and kvprof's Triton writers (bitwise
#              against their references, the launcher on and off, signed launches against the
#              Python path, graph capture), and every kvprof writer through its pool and called
#              directly (reference rows or a refusal); tests and eager first build the C++ signature helper
#   eager      the contracts' checks per call, in Python and kept per call key (bench_writer_checks.py);
#              kvprof bench's eager mode for every fused writer (store, rope + store, MLA, paged), and
#              lab/eager_split.py: an eager Triton write's host time, layer by layer of its launch path
#   eager-ab   the rope, MLA and paged eager writes through their pools with the C++ helper and with
#              KVPROF_TRITON_SIGNATURE=0, alternating, two rounds
#   prefill    kvprof capture of an eager 1/64/4096-token prefill of the writes alone through the pool,
#              triton_fused (signed launches, then KVPROF_TRITON_SIGNATURE=0), cuda_fused, store_kv_fused
#   peers-32   kvprof bench, 32x128 rows: kvprof's fused stores against SGLang's JIT store_cache,
#              bf16 and fp8, CUDA-graph replays and after an L2 flush (this card's launch-table row)
#   peers-1-8  the same for 1x128 and 8x128 rows (PEERS_SHAPES: other shapes, e.g. 8x128 alone, then
#              written as bench-peers-8x128; PEERS_LIMIT: the part's seconds, default 120)
#   own        lab/layer_own_time.py: what the fused write adds to the Llama-3.1-70B TP8 decoder layer
#              and its own time, bf16 and fp8 caches, 3 captures in rotated order, beside an empty PDL
#              node and SGLang's set_kv_buffer (the fp8 saving)
#   rope-4096  lab/rope_bench.py at 4096 tokens: rope + store beside the rotary alone (kvprof's, SGLang's) and
#              a plain copy of its bytes in the same graphs (copy:5376, copy:5120: the floor at its own size)
#   rope-order the rope + store kernel's two program orders (RopeConfig.token_major): its GPU tests
#              (bitwise), then lab/rope_bench.py at 4096 and at 1-512 tokens over launch shapes in both
#   rope-grid  the rope + store kernel's persistent grid and streaming cache hints (RopeConfig.persistent,
#              .stream): its GPU tests (bitwise), then lab/rope_bench.py at 4096 and 512 tokens over
#              persistent grids of 1-16 programs per SM, with and without the hints, beside the table's
#              shapes and the same-size copies
#   rope-stream the rope + store kernel's streaming cache hints (RopeConfig.stream) over launch shapes in
#              both orders: its GPU tests (bitwise, the card's table included), then lab/rope_bench.py at
#              4096 tokens and at 1-2048 beside the same-size copies (the H100 row's source), and
#              lab/rope_rows.py's picks over the two
#   tune-store lab/tune_cards.py: every candidate launch shape of triton_fused at the bench grid's
#              points, in graphs and after an L2 flush, beside store_cache; this card's rows by both
#              modes (TUNE_BUDGET seconds for the sweep, default 300, less where the call's budget
#              leaves less)
# Everything ends up in $OUT/card-tables.tgz (the device returns few files); the log in $OUT/card-tables.txt.
set -uo pipefail
OUT=${OUT:-/tmp/kvprof-gpu}
R=$OUT/card-tables
parts=" ${*:-env peers-32 peers-1-8 own rope-4096} "
for part in $parts; do
  case $part in env|tests|eager|eager-ab|prefill|peers-32|peers-1-8|own|rope-4096|rope-order|rope-grid|rope-stream|tune-store) ;;
    *) echo "card_tables.sh: unknown part $part (known: env tests eager eager-ab prefill peers-32 peers-1-8 own" \
            "rope-4096 rope-order rope-grid rope-stream tune-store)" >&2
       exit 2 ;;
  esac
done
budget=${CARD_BUDGET:-560}
case $budget in ''|*[!0-9]*) echo "card_tables.sh: CARD_BUDGET must be whole seconds, got '$budget'" >&2; exit 2 ;; esac
case ${PEERS_LIMIT:-120} in ''|*[!0-9]*) echo "card_tables.sh: PEERS_LIMIT must be whole seconds, got '$PEERS_LIMIT'" >&2
  exit 2 ;; esac
case ${TUNE_BUDGET:-300} in ''|*[!0-9]*) echo "card_tables.sh: TUNE_BUDGET must be whole seconds, got '$TUNE_BUDGET'" >&2
  exit 2 ;; esac
start=$SECONDS
mkdir -p "$R"
log=$OUT/card-tables.txt
if [ -d .whl ] && [ ! -d /tmp/site/sglang ]; then bash gpu/sglang_check.sh install >/dev/null 2>&1; fi
SP=$PWD
if [ -d /tmp/site/sglang ]; then
  SP=$SP:/tmp/site
  PYTHONPATH=$SP python3 -c "import sgl_kernel" 2>/dev/null || SP=$SP:$PWD/gpu/sgl_kernel_stub
fi
export TRITON_INTERPRET=0 PYTHONPATH=$SP${PYTHONPATH:+:$PYTHONPATH}
run() {  # run PART LIMIT NAME CMD...: output to $R/NAME.txt
  case $parts in *" $1 "*) ;; *) return ;; esac
  local limit=$2 name=$3; shift 3
  local left=$(( budget - (SECONDS - start) - 5 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then echo "no time left for $name" | tee -a "$log"; return; fi
  echo "== $(date -u +%H:%M:%S) $name (limit ${limit}s): $*" | tee -a "$log"
  timeout -k 5 "$limit" "$@" > "$R/$name.txt" 2>&1
  echo "   exit $? after $(( SECONDS - start ))s" | tee -a "$log"
}
run env 30 env bash gpu/run_gpu_checks.sh env
# the launcher's C++ signature helper, built once (tens of seconds) before anything is timed
for part in tests eager eager-ab prefill; do
  case $parts in *" $part "*) run $part 120 signature-helper python3 -c "from kvprof.kvcache import \
signature as s; print('signature helper:', s.load() or 'built')"; break ;; esac
done
run tests 150 gpu-tests python3 -m pytest tests/test_triton_launch.py tests/test_signed_launch.py \
  tests/test_fused_writers.py tests/test_rope_gpu.py tests/test_layouts_gpu.py -m gpu \
  -k "triton and not sgl and not sglang or signed" -q -p no:cacheprovider -rfs --maxfail=5
# every writer of kvprof's through its pool and called directly, on the GPU (the contracts'
# checks kept per call key once the helper is loaded: the first CUDA write loads it)
run tests 120 gpu-pool-tests python3 -m pytest tests/test_writer_properties.py tests/test_writer_contracts.py -m gpu \
  -k "index_put or fused or mla_triton or mla_cuda or paged_triton or paged_cuda" -q -p no:cacheprovider -rfs \
  --maxfail=5
run eager 60 writer-checks python3 benchmarks/bench_writer_checks.py --device cuda --calls 5000 --repeats 7
run eager 60 eager-split env OUT="$R" python3 lab/eager_split.py
run eager 55 eager-store python3 -m kvprof bench --modes eager \
  --variants index_put,triton_fused,cuda_fused,store_kv_fused --shapes 8x128 --dtypes "bf16,fp8_e4m3<-bf16" \
  --tokens 1,64,4096 --eager-repeats 20 --out "$R/eager-store"
run eager 55 eager-rope python3 -m kvprof bench --family rope --modes eager \
  --variants rope_then_triton_fused,rope_triton_fused,rope_cuda_fused --shapes 8x1x128 --dtypes bf16 \
  --tokens 1,64,4096 --eager-repeats 20 --out "$R/eager-rope"
run eager 90 eager-layouts python3 -m kvprof.bench.layouts --tokens 1,64 --replays 20 --out "$R/eager-layouts"
# the same eager writes through their pools with the C++ helper (signed launches, the contracts'
# kept checks) and without it (KVPROF_TRITON_SIGNATURE=0), alternating, two rounds in one call
for round in 1 2; do
  for helper in on off; do
    sig=1; [ $helper = off ] && sig=0
    run eager-ab 35 "ab-rope-$helper-$round" env KVPROF_TRITON_SIGNATURE=$sig python3 -m kvprof bench --family rope \
      --modes eager --variants rope_triton_fused,rope_cuda_fused --shapes 8x1x128 --dtypes bf16 --tokens 1,64,4096 \
      --eager-repeats 20 --out "$R/ab-rope-$helper-$round"
    run eager-ab 50 "ab-layouts-$helper-$round" env KVPROF_TRITON_SIGNATURE=$sig python3 -m kvprof.bench.layouts \
      --tokens 1,64 --modes eager --replays 20 --variants mla_triton,mla_cuda,paged_triton,paged_cuda \
      --out "$R/ab-layouts-$helper-$round"
  done
done
# a prefill of the writes alone through the pool, eager, each fused store writer: the Triton writers
# with their signed launches and with the C++ signature helper left out (the reference's µs per write
# is the host's launch path where the write is shorter on the GPU; torch.profiler's host launch)
prefill=(python3 -m kvprof capture --phase prefill --prefill-tokens 1,64,4096 --variants
         triton_fused,cuda_fused,store_kv_fused --profiler torch --steps 5 --reference-steps 100 --no-progress)
run prefill 120 prefill-signed "${prefill[@]}" --out /tmp/kvprof-prefill --run-id signed --force
run prefill 120 prefill-python env KVPROF_TRITON_SIGNATURE=0 "${prefill[@]}" --out /tmp/kvprof-prefill \
  --run-id python --force
run prefill 60 prefill-analyze bash -c 'for r in signed python; do echo "== $r"; python3 -m kvprof analyze \
  /tmp/kvprof-prefill/$r; done'
peers=(python3 -m kvprof bench --variants triton_fused,store_kv_fused,cuda_fused,sglang_store_cache
       --modes graph,cold --dtypes "bf16,fp8_e4m3<-bf16")
run peers-32 150 bench-peers-32x128 "${peers[@]}" --shapes 32x128 --out "$R/bench-peers-32x128"
shapes=${PEERS_SHAPES:-1x128,8x128}
name=bench-peers-1-8x128; [ -n "${PEERS_SHAPES:-}" ] && name=bench-peers-${shapes//,/-}
run peers-1-8 "${PEERS_LIMIT:-120}" "$name" "${peers[@]}" --shapes "$shapes" --out "$R/$name"
run own 230 layer-own-time env OUT="$R" python3 lab/layer_own_time.py --budget-s "${OWN_BUDGET:-190}" \
  --variants triton_fused,sglang_set_kv_buffer,floor_empty_pdl --rotations 3 --steps 40 --replays 3
run rope-4096 70 rope-4096 env ROPE_TOKENS=4096 ROPE_CAPTURES=3 ROPE_JSON=rope-4096.json OUT="$R" \
  ROPE_VARIANTS=copy:5376,copy:5120,rotary:sglang,rotary:kvprof,rope_triton_fused,rope_cuda_fused python3 lab/rope_bench.py
run rope-order 90 rope-order-tests python3 -m pytest tests/test_rope_gpu.py -m gpu -k rope_triton_fused -q \
  -p no:cacheprovider -rfs --maxfail=5
f=rope_triton_fused
run rope-order 80 rope-order-4096 env ROPE_TOKENS=4096 ROPE_CAPTURES=3 ROPE_JSON=rope-order-4096.json OUT="$R" \
  ROPE_VARIANTS=rotary:sglang,rotary:kvprof,$f,$f@16.1.8t,$f@8.1.4,$f@8.1.4t,$f@8.1.8t,$f@16.1.4t,$f@32.1.16,\
$f@32.1.16t,$f@32.1.8t,$f@16.2.8t,$f@8.2.8t,$f@4.1.4t,$f@4.1.2t,$f@64.1.16t python3 lab/rope_bench.py
run rope-order 80 rope-order-decode env ROPE_TOKENS=1,10,64,512 ROPE_CAPTURES=3 ROPE_JSON=rope-order-decode.json \
  OUT="$R" ROPE_VARIANTS=$f,$f@1.1.1,$f@1.1.1t,$f@1.1.2t,$f@1.2.4,$f@1.2.4t,$f@2.1.2t,$f@4.1.4t,$f@8.1.4,$f@8.1.4t,\
$f@16.1.8t python3 lab/rope_bench.py
run rope-grid 90 rope-grid-tests python3 -m pytest tests/test_rope_gpu.py -m gpu -k rope_triton_fused -q \
  -p no:cacheprovider -rfs --maxfail=5
run rope-grid 90 rope-grid-4096 env ROPE_TOKENS=4096 ROPE_CAPTURES=3 ROPE_JSON=rope-grid-4096.json OUT="$R" \
  ROPE_VARIANTS=copy:5376,copy:5120,rotary:sglang,rotary:kvprof,$f,$f@16.1.8t,$f@16.1.8ts,$f@16.1.8p1,$f@16.1.8p2,$f@16.1.8p4,\
$f@16.1.8p8,$f@16.1.8sp2,$f@16.1.8sp4,$f@32.1.16p2,$f@32.1.16p4,$f@8.1.4p8,$f@8.1.4p16,$f@16.2.8p4,$f@32.1.8p4,$f@8.8.8t,$f@8.8.8p2 \
  python3 lab/rope_bench.py
run rope-grid 70 rope-grid-512 env ROPE_TOKENS=512 ROPE_CAPTURES=3 ROPE_JSON=rope-grid-512.json OUT="$R" \
  ROPE_VARIANTS=copy:5376,rotary:kvprof,$f,$f@8.1.4t,$f@8.1.4ts,$f@8.1.4p2,$f@8.1.4p4,$f@8.1.4p8,$f@8.1.4sp4,$f@4.1.4p8 \
  python3 lab/rope_bench.py
run rope-stream 90 rope-stream-tests python3 -m pytest tests/test_rope_gpu.py -m gpu -k rope_triton_fused -q \
  -p no:cacheprovider -rfs --maxfail=5
run rope-stream 70 rope-stream-4096 env ROPE_TOKENS=4096 ROPE_CAPTURES=3 ROPE_JSON=rope-stream-4096.json OUT="$R" \
  ROPE_VARIANTS=copy:5376,copy:5120,rotary:sglang,$f,$f@16.1.8t,$f@16.1.8ts,$f@16.1.8s,$f@32.1.16ts,$f@32.1.16s,\
$f@16.1.4ts,$f@16.1.4s,$f@8.1.4ts,$f@8.1.4s,$f@16.2.8ts,$f@32.1.8s,$f@8.1.8s,$f@16.1.16s,$f@64.1.16s python3 lab/rope_bench.py
run rope-stream 70 rope-stream-decode env ROPE_TOKENS=1,10,64,512,2048 ROPE_CAPTURES=3 ROPE_JSON=rope-stream-decode.json \
  OUT="$R" ROPE_VARIANTS=copy:5376,$f,$f@1.1.1s,$f@1.1.1ts,$f@1.2.4s,$f@2.1.2ts,$f@4.1.4ts,$f@8.1.4t,$f@8.1.4ts,\
$f@8.1.4s,$f@16.1.8s,$f@16.1.8ts,$f@8.1.8ts python3 lab/rope_bench.py
# the row's entries by least regret over this call's two files (lab/rope_rows.py; with earlier
# runs' files beside them off the card)
run rope-stream 20 rope-stream-rows python3 lab/rope_rows.py "$R/rope-stream-decode.json" "$R/rope-stream-4096.json"
# the sweep's own budget within what the part has left, with a minute for its report
left=$(( budget - (SECONDS - start) - 5 )); [ "$left" -gt 400 ] && left=400
tune=${TUNE_BUDGET:-300}; [ "$tune" -gt $(( left - 60 )) ] && tune=$(( left - 60 )); [ "$tune" -lt 1 ] && tune=1
run tune-store 400 tune-store env OUT="$R" CARDS_BUDGET_S="$tune" python3 lab/tune_cards.py
cp "$log" "$R/" 2>/dev/null
tar czf "$OUT/card-tables.tgz" -C "$OUT" card-tables && rm -rf "$R"
echo "wrote $OUT/card-tables.tgz after $(( SECONDS - start ))s"
