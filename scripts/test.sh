#!/usr/bin/env bash
# The test command of the README and of CI: everything that runs on a CPU, Triton under its
# interpreter, the dashboard in a real headless Chromium, the tests marked `slow` included
# (plain `pytest` leaves them out: pyproject's addopts; a -m given here replaces this one).
# GPU tests are marked `gpu` and run on the H200 by gpu/run_gpu_checks.sh.
#
# Two worker processes (pytest-xdist, in the dev extra), each test file whole on one worker
# (--dist loadfile): a file's module fixtures (the dashboard's server and Chromium, SGLang's
# fork server) start once, and its tests run in file order, as in one process.
# KVPROF_TEST_WORKERS=N sets the number of workers; 0 runs every test in this process.
# Timings, before and after: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
workers="${KVPROF_TEST_WORKERS:-2}"
parallel=()
if [ "$workers" != 0 ]; then
  if python -c "import xdist" 2>/dev/null; then
    parallel=(-n "$workers" --dist loadfile)
  elif [ -n "${CI:-}" ]; then  # CI installs the dev extra: its absence there is a broken install
    echo "scripts/test.sh: pytest-xdist is not installed (the dev extra has it)" >&2
    exit 1
  else
    echo "scripts/test.sh: pytest-xdist is not installed (pip install -e '.[dev]'): one process" >&2
  fi
fi
python -m pytest -q -p no:cacheprovider -m "slow or not slow" "${parallel[@]}" "$@"
