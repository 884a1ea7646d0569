"""Capture: run the workload per variant under the profilers and write the run directory."""
