#!/usr/bin/env bash
# The test command of the README and of CI: everything that runs on a CPU, Triton under its
# interpreter, the dashboard in a real headless Chromium, the tests marked `slow` included
# (plain `pytest` leaves them out: pyproject's addopts; a -m given here replaces this one).
# GPU tests are marked `gpu` and run on the H200 by gpu/run_gpu_checks.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
python -m pytest -q -p no:cacheprovider -m "slow or not slow" "$@"
