"""The torch side's lower half: what a KV cache is and how it is written.

A one-way stack of its own (pyproject.toml's kvprof.kvcache layers contract; bottom to top):
dtypes, model shapes and phases; input checks, memory guards and the device; the writer
contracts (``contracts``); the one writer registry (``registry``); kvprof's writers
(``writers/``); what a layout is (``layouts/``); the pools (``pool``, ``mla_pool``,
``paged_pool``); their instrumentation (``instrument``); the decoder layer around a write
(``layer``). Everything that needs torch to hold or write a cache lives here; capture, bench,
verify and the engine plugins sit above it.
"""
