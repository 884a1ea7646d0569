#!/usr/bin/env bash
# capture --ranks on a machine with several GPUs: one process per GPU through NCCL,
# Llama-3.1-70B at TP = ranks (8 on an 8-GPU machine), two_stream and the fused writers,
# decode from CUDA graphs and a prefill chunk; then the same inside decoder layers
# (--context layer: the layer's own all-reduces after attention and MLP).
#   there, with .gpu/ beside the checkout:  source .gpu/env.sh; bash gpu/ranks.sh
# RANKS (default: every GPU), VARIANTS, STEPS override. NVLink multicast stays off.
# Results: $OUT/ranks/<run-id>/ (manifest, per-rank traces, summary.json 'ranks') and the
# console output beside it; the per-rank rows, skew and collective wait are summary.json's
# 'ranks' key.
set -uo pipefail
OUT=${OUT:-/tmp/kvprof-gpu}
mkdir -p "$OUT/ranks"
N=${RANKS:-$(nvidia-smi -L | wc -l)}
VARIANTS=${VARIANTS:-two_stream,triton_fused,cuda_fused,sgl_kernel_cubin}
STEPS=${STEPS:-20}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/ranks/env.txt"
for context in none layer; do
  stamp "ranks $N context $context"
  timeout ${RANKS_TIMEOUT:-540} python3 -m kvprof capture --model llama-3.1-70b --tp "$N" --ranks "$N" \
    --variants "$VARIANTS" --phase decode,prefill --batch-sizes 1,10,64 --prefill-tokens 4096 \
    --steps "$STEPS" --context "$context" --no-progress --out "$OUT/ranks" --run-id "tp$N-$context" \
    2>&1 | tee "$OUT/ranks/tp$N-$context.txt"
done
