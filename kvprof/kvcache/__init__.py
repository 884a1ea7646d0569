"""The torch side's lower half: what a KV cache is and how it is written.

Writers (the contracts, the one registry and kvprof's own writers), layouts (the cache forms
an engine writes), pools over them, and what runs a write in context (instrumentation, the
decoder layer, workloads, model shapes). Everything that needs torch to hold or write a cache
lives here; capture, bench, verify and the engine plugins sit above it.
"""
