#!/usr/bin/env bash
# A short check that capture (torch + nsys passes) and bench run on the GPU machine,
# before the long run of gpu/run_gpu_checks.sh.
set -uo pipefail
OUT=${OUT:-/tmp/kvprof-smoke}
python3 -m kvprof capture --model llama-3.1-70b --tp 8 --variants index_put,two_stream,triton_fused,cuda_fused \
  --phase decode,prefill --batch-sizes 1,64 --prefill-tokens 512 --steps 2 --warmup 1 --profiler both \
  --out /tmp/smoke --run-id smoke --no-progress 2>&1 | tail -60
ls -la /tmp/smoke/smoke
( cd /tmp/smoke && tar czf "$OUT/smoke.tgz" smoke )
timeout 200 python3 -m kvprof bench --shapes 1x128,8x128 --dtypes bf16,fp8_e4m3\<-bf16 --tokens 1,4096 --replays 20 --eager-repeats 5 --out "$OUT/bench" 2>&1 | tail -40
