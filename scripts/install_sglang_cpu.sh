#!/usr/bin/env bash
# SGLang's package on a CPU-only machine, for the tests that run SGLang's real KV pool.
#
# `pip install sglang` pulls a CUDA torch and GPU kernels (several GB). Its pool module
# (sglang.srt.mem_cache.memory_pool) imports on CPU torch with SGLang installed without its
# dependencies plus the light packages below, each needed on that import path (checked one
# by one: blocking any of them breaks the import).
#
# torchvision: SGLang imports it on that path (sglang.srt.configs -> nano_nemotron_vl ->
# multimodal.internvl_utils: torchvision.transforms). Every torchvision wheel on PyPI for
# Linux x86-64 links CUDA torch (libtorch_cuda.so, libcudart), so its compiled ops never load
# on CPU torch; from 0.17 on it then fails at import (an unconditional fake-kernel
# registration for torchvision::nms: "operator torchvision::nms does not exist"). 0.16.2 is
# the newest whose import tolerates the missing ops: SGLang's import needs only its
# pure-Python transforms. Installed without dependencies (it pins torch 2.1.2).
#
# Use: bash scripts/install_sglang_cpu.sh  (inside the venv kvprof is installed in)
set -euo pipefail
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
python -m pip install -q \
  "transformers==5.19.0" "openai==2.8.0" "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" \
  numpy triton orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
  IPython aiohttp dill einops gguf loguru partial-json-parser
python -m pip install -q --no-deps "sglang==${SGLANG_VERSION}" "torchvision==0.16.2" "compressed-tensors==0.18.0"
# Fail here, with SGLang's own error, rather than in the tests.
python -W ignore -c "import sglang.srt.mem_cache.memory_pool, sglang.srt.plugins; print('sglang', __import__('importlib.metadata').metadata.version('sglang'), 'imports')"
