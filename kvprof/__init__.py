"""kvprof: profile how an LLM serving engine writes new keys and values into its KV cache.

Pipeline (data flows one way):
workload -> pool + writer -> instrumented capture -> trace readers
-> one normalized event table -> metrics -> report / dashboard.
"""

__version__ = "0.1.0"
