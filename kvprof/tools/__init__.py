"""Command-line tools that prepare what kvprof measures against (run with python -m kvprof.tools.NAME)."""
