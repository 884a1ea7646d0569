#!/usr/bin/env bash
# The test command of the README and of CI: everything that runs on a CPU, Triton under its
# interpreter, the dashboard in a real headless Chromium, the tests marked `slow` included
# (plain `pytest` leaves them out: pyproject's addopts). GPU tests are marked `gpu` and run on
# the H200 by gpu/run_gpu_checks.sh.
#
# Two worker processes (pytest-xdist, in the dev extra), each test file whole on one worker
# (--dist loadfile): a file's module fixtures (the dashboard's server and Chromium, SGLang's
# fork server) start once, and its tests run in file order, as in one process. Then the tests
# marked `serial` (they judge measured timings: the gate on real captures) in this process
# alone, with no worker beside them. KVPROF_TEST_WORKERS=N sets the number of workers; 0 runs
# every test in one process. Arguments go to pytest; one that has a -m runs that selection in
# one pass (with the workers). Timings, before and after: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
run=(python -m pytest -q -p no:cacheprovider)
workers="${KVPROF_TEST_WORKERS:-2}"
if [ "$workers" != 0 ] && ! python -c "import xdist" 2>/dev/null; then
  if [ -n "${CI:-}" ]; then  # CI installs the dev extra: its absence there is a broken install
    echo "scripts/test.sh: pytest-xdist is not installed (the dev extra has it)" >&2
    exit 1
  fi
  echo "scripts/test.sh: pytest-xdist is not installed (pip install -e '.[dev]'): one process" >&2
  workers=0
fi
if [ "$workers" = 0 ]; then
  exec "${run[@]}" -m "slow or not slow" "$@"
fi
for arg in "$@"; do
  case "$arg" in -m*) exec "${run[@]}" -n "$workers" --dist loadfile "$@" ;; esac
done
# pytest's exit code 5 is "no tests collected": fine for one pass of two, not for both
status=0
"${run[@]}" -n "$workers" --dist loadfile -m "(slow or not slow) and not serial" "$@" || status=$?
if [ "$status" != 0 ] && [ "$status" != 5 ]; then exit "$status"; fi
first=$status
status=0
"${run[@]}" -m serial "$@" || status=$?
if [ "$status" = 5 ] && [ "$first" = 0 ]; then status=0; fi
exit "$status"
