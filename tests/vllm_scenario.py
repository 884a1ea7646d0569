"""One vLLM engine on a CPU with kvprof's plugin loaded by vLLM itself (run by tests/test_vllm_plugin.py
in vLLM's interpreter: ``python tests/vllm_scenario.py OUT_DIR``).

A 2-layer Llama (hidden 256, head_dim 64, dummy weights, no tokenizer, eager) generates 4 tokens
from one 8-token prompt: 1 prefill and 3 decode forwards. Phase 1 runs under torch.profiler
with vLLM's own writes (the trace lands in KVPROF_VLLM_DIR beside the plugin's sidecar). Phase 2 names a
kvprof paged writer (what ``KVPROF_VLLM_WRITER`` sets when the plugin loads) and generates the
same tokens again: vLLM's CPU backend packs each block for its instruction set, so every write
stays vLLM's, counted as a fallback with that reason (the route's bytes are checked against
vLLM's op on the CUDA backends' packed layout by tests/vllm_packed_write.py). Results go to
OUT_DIR/result.json.
"""

from __future__ import annotations

import json
import os
import sys

out = sys.argv[1]
writer = sys.argv[2] if len(sys.argv) > 2 else "paged_triton"
model = os.path.join(out, "model")
os.makedirs(model, exist_ok=True)
with open(os.path.join(model, "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
               "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
               "torch_dtype": "bfloat16", "rope_theta": 10000.0, "tie_word_embeddings": False}, f)

from torch.profiler import ProfilerActivity, profile  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
          max_model_len=128, max_num_seqs=4, seed=0, enable_prefix_caching=False)
prompt = [TokensPrompt(prompt_token_ids=list(range(1, 9)))]
params = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False, temperature=0)

from kvprof.integrations import vllm as plugin  # noqa: E402  (the module vLLM loaded: one per process)

if not plugin.STATE.hooked:
    from importlib import metadata

    eps = [e.value for e in metadata.entry_points(group="vllm.general_plugins")]
    sys.exit(f"vLLM did not load kvprof's plugin (KVPROF_VLLM={os.environ.get('KVPROF_VLLM')!r}, "
             f"VLLM_PLUGINS={os.environ.get('VLLM_PLUGINS')!r}, vllm.general_plugins: {eps}): "
             "pip install -e . into vLLM's venv")

result: dict = {"hooked": list(plugin.STATE.hooked), "paths_before": dict(plugin.STATE.paths)}
with profile(activities=[ProfilerActivity.CPU]) as prof:
    tokens = llm.generate(prompt, params)[0].outputs[0].token_ids
prof.export_chrome_trace(os.path.join(os.environ["KVPROF_VLLM_DIR"], "vllm-cpu.pt.trace.json"))
result["tokens"] = list(tokens)
result["paths_phase1"] = dict(plugin.STATE.paths)

plugin.STATE.writer_name = writer
routed = llm.generate(prompt, params)[0].outputs[0].token_ids
result["tokens_routed"] = list(routed)
result["paths_phase2"] = dict(plugin.STATE.paths)

import msgspec  # noqa: E402

ledger = plugin.STATE.ledger.record()
result["ledger"] = msgspec.to_builtins(ledger) if ledger is not None else None

result["fallbacks"] = dict(plugin.STATE.fallbacks)
result["sidecar"] = str(plugin.STATE.write_sidecar())
with open(os.path.join(out, "result.json"), "w") as f:
    json.dump(result, f)
