"""kvprof's plugin inside SGLang's real package: its MHATokenToKVPool on CPU, the plugin loaded
through SGLang's own ``load_plugins()``; and its rotary embedding with the KV store fused in
(``ROPE_SCENARIO``, see its test for what is real there).

Each scenario runs in a process of its own (SGLang loads plugins once per process and patches
its classes for good), forked from one server process that has imported torch and SGLang's
modules, and never kvprof's plugin nor ``load_plugins()``: importing SGLang takes about 7 s of
the 10 s a fresh interpreter took per scenario. Pool A writes before the plugin loads, pool B
the same writes after, under torch.profiler; the test compares the buffers bit for bit, finds
kvprof's ranges in the trace, reads the sidecar, and runs ``kvprof analyze`` on the
SGLang-named trace folder.

Needs SGLang (scripts/install_sglang_cpu.sh); skipped without it, except where
KVPROF_REQUIRE_SGLANG=1 (CI) makes its absence a failure.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kvprof.cli import main


def _missing() -> str | None:
    try:
        metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "SGLang is not installed (bash scripts/install_sglang_cpu.sh)"
    if not any(ep.value.startswith("kvprof.") for ep in metadata.entry_points(group="sglang.srt.plugins")):
        return "kvprof's sglang.srt.plugins entry point is not installed (pip install -e . again)"
    return None


_REASON = _missing()
if _REASON and os.environ.get("KVPROF_REQUIRE_SGLANG") == "1":
    pytest.fail(f"KVPROF_REQUIRE_SGLANG=1 but {_REASON}", pytrace=False)
pytestmark = [pytest.mark.skipif(_REASON is not None, reason=_REASON or ""), pytest.mark.slow]

SCENARIO = r'''
import json, os, sys, torch
out = sys.argv[1]
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, KVWriteLoc
from sglang.srt.plugins import load_plugins

class Layer:  # what SGLang passes: its RadixAttention, of which the pool reads layer_id
    def __init__(self, i): self.layer_id = i

def pools():
    return {
        "bf16": MHATokenToKVPool(size=96, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64,
                                 layer_num=3, device="cpu", enable_memory_saver=False),
        "fp8": MHATokenToKVPool(size=96, page_size=1, dtype=torch.float8_e4m3fn, head_num=4, head_dim=32,
                                layer_num=3, device="cpu", enable_memory_saver=False),
    }

g = torch.Generator().manual_seed(0)
calls = []  # (pool, how, layer, loc, k, v, scale)
for step, tokens in enumerate((1, 4, 7)):
    loc = torch.randperm(95, generator=g)[:tokens] + 1
    for layer in range(3):
        for name, heads, dim in (("bf16", 2, 64), ("fp8", 4, 32)):
            k = torch.randn(tokens, heads, dim, generator=g).bfloat16()
            v = torch.randn(tokens, heads, dim, generator=g).bfloat16()
            calls.append((name, ("kw", "wrap", "pos")[layer], layer, loc, k, v, 2.0 if name == "fp8" else None))
if os.environ.get("KVPROF_SGLANG_WRITER"):  # rows kvprof's writers refuse (float64): SGLang writes them
    k = torch.randn(3, 2, 64, generator=g, dtype=torch.float64)
    calls.append(("bf16", "pos", 2, torch.tensor([5, 9, 11]), k, k * 2, None))

def run(ps):
    for name, how, layer, loc, k, v, scale in calls:
        k, v = k.clone(), v.clone()  # SGLang divides the caller's rows by the scale in place
        if how == "kw":
            ps[name].set_kv_buffer(Layer(layer), loc, k, v, k_scale=scale, v_scale=scale)
        elif how == "wrap":
            ps[name].set_kv_buffer(None, KVWriteLoc(loc), k, v, scale, scale, layer_id_override=layer)
        else:
            ps[name].set_kv_buffer(Layer(layer), loc, k, v, scale, scale)

a = pools()
run(a)
load_plugins()
hooked = hasattr(MHATokenToKVPool.set_kv_buffer, "__wrapped__")
b = pools()
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    run(b)
prof.export_chrome_trace(os.path.join(out, "1790857026.5-TP-0.trace.json.gz"))
same = all(torch.equal(x, y) for n in a for x, y in zip(a[n].k_buffer + a[n].v_buffer, b[n].k_buffer + b[n].v_buffer))
written = all(bool(x.view(torch.uint8).any()) for n in b for x in b[n].k_buffer)
json.dump({"hooked": hooked, "same": same, "written": written, "calls": len(calls)},
          open(os.path.join(out, "result.txt"), "w"))
'''


# SGLang's rotary embedding with FusedSetKVBufferArg, as Qwen3-MoE / GPT-OSS call it on CUDA with a
# bf16 cache. What runs is SGLang's own: get_rope's RotaryEmbedding (built as on CUDA: JIT kernel,
# float32 cos/sin table), its forward() dispatch pinned to forward_cuda, create_fused_set_kv_buffer_arg
# inside a forward context, apply_rope_with_cos_sin_cache_inplace, the MHATokenToKVPool. What
# cannot run on a CPU is the JIT CUDA op at the bottom (apply_rope_inplace[_with_kvcache]): the
# stand-ins below take its place, kvprof's float32 reference rounded once to bf16, then the store.
ROPE_SCENARIO = r'''
import json, os, sys, torch
out = sys.argv[1]
import sglang.kernels.ops.attention.rope as sgl_rope
from sglang.srt.layers.rotary_embedding import base as rotary_base
from sglang.srt.layers.rotary_embedding.factory import get_rope
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.models.utils import create_fused_set_kv_buffer_arg
from sglang.srt.plugins import load_plugins
from kvprof.kvcache.writers.rope_reference import rope_reference

def cpu_rope(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0):  # for SGLang's JIT apply_rope_inplace
    rq, rk = rope_reference(q, k, cos_sin_cache, positions, is_neox, rope_dim or None)
    q.copy_(rq)
    k.copy_(rk)

def cpu_rope_store(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, *, is_neox, rope_dim=0):
    cpu_rope(q, k, cos_sin_cache, positions, is_neox=is_neox, rope_dim=rope_dim)  # ... and its _with_kvcache
    k_cache[out_loc] = k.reshape(k.shape[0], -1)
    v_cache[out_loc] = v.reshape(v.shape[0], -1)

sgl_rope.apply_rope_inplace = cpu_rope
sgl_rope.apply_rope_inplace_with_kvcache = cpu_rope_store
# base.py binds the wrapper only where CUDA is available; SGLang's hooks follow such bindings
rotary_base.apply_rope_with_cos_sin_cache_inplace = sgl_rope.apply_rope_with_cos_sin_cache_inplace
HQ, HK, D, LAYERS = 4, 2, 64, 3
rotary_base._is_cuda = True  # the constructor decides as on CUDA: the JIT kernel, a float32 table
try:
    rotary = get_rope(D, D, 4096, 10000, True, dtype=torch.bfloat16)
finally:
    rotary_base._is_cuda = False
assert not rotary.use_fallback_kernel and rotary.cos_sin_cache.dtype == torch.float32
rotary._forward_method = rotary.forward_cuda  # what BaseFusedOp's dispatch picks on CUDA

class Attn:  # what create_fused_set_kv_buffer_arg reads of SGLang's RadixAttention
    def __init__(self, i): self.layer_id, self.k_scale, self.v_scale = i, None, None

class Backend:
    def __init__(self, pool): self.token_to_kv_pool = pool

class Batch:
    def __init__(self, loc): self.out_cache_loc = loc

g = torch.Generator().manual_seed(0)
calls = []  # (layer, positions, loc, q, k, v, fused)
for tokens in (1, 4, 7):  # three steps
    loc = torch.randperm(95, generator=g)[:tokens] + 1
    pos = torch.randint(0, 4096, (tokens,), generator=g)
    for layer in range(LAYERS):
        q = torch.randn(tokens, HQ * D, generator=g).bfloat16()
        k = torch.randn(tokens, HK * D, generator=g).bfloat16()
        v = torch.randn(tokens, HK * D, generator=g).bfloat16()
        calls.append((layer, pos, loc, q, k, v, True))
    calls.append((0, pos, loc, q, k, v, False))  # the rotary embedding alone: no write

def pool():
    return MHATokenToKVPool(size=96, page_size=1, dtype=torch.bfloat16, head_num=HK, head_dim=D,
                            layer_num=LAYERS, device="cpu", enable_memory_saver=False)

def run(p):
    outs = []
    with forward_context(ForwardContext(attn_backend=Backend(p))):
        for layer, pos, loc, q, k, v, fused in calls:
            q, k = q.clone(), k.clone()
            arg = create_fused_set_kv_buffer_arg(v, Attn(layer), Batch(loc)) if fused else None
            outs += list(rotary(pos, q, k, fused_set_kv_buffer_arg=arg))
    return outs

a = pool()
out_a = run(a)
load_plugins()
hooked = hasattr(sgl_rope.apply_rope_with_cos_sin_cache_inplace, "__wrapped__")
bound = rotary_base.apply_rope_with_cos_sin_cache_inplace is sgl_rope.apply_rope_with_cos_sin_cache_inplace
b = pool()
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    out_b = run(b)
prof.export_chrome_trace(os.path.join(out, "1790857026.5-TP-0.trace.json.gz"))
same = all(torch.equal(x, y) for x, y in zip(a.k_buffer + a.v_buffer, b.k_buffer + b.v_buffer))
same_qk = len(out_a) == len(out_b) and all(torch.equal(x, y) for x, y in zip(out_a, out_b))
written = all(bool(x.view(torch.uint8).any()) for x in b.k_buffer + b.v_buffer)
json.dump({"hooked": hooked and bound, "same": same, "same_qk": same_qk, "written": written},
          open(os.path.join(out, "result.txt"), "w"))
'''


# SGLang's real pool written inside CUDA graph captures, as its graph runners capture decode:
# torch.cuda.CUDAGraph's own Python methods run (the plugin hooks them); what cannot run on a CPU
# is the C graph class under them, replaced by no-ops below (capture and replay record nothing).
GRAPH_SCENARIO = r'''
import json, os, sys, torch
out = sys.argv[1]
import torch.cuda.graphs as torch_graphs
cuda_part = torch_graphs.CUDAGraph.__mro__[1]  # torch's C graph class (a stand-in on CPU builds)
cuda_part.__new__ = lambda cls, *a, **k: object.__new__(cls)
cuda_part.__init__ = lambda self, *a, **k: None
for name in ("capture_begin", "capture_end", "replay"):
    setattr(cuda_part, name, lambda self, *a, **k: None)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.plugins import load_plugins
load_plugins()
hooked = getattr(torch.cuda.CUDAGraph.capture_begin, "_kvprof_graph_hook", False)

class Layer:
    def __init__(self, i): self.layer_id = i

pool = MHATokenToKVPool(size=96, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64, layer_num=3,
                        device="cpu", enable_memory_saver=False)
g = torch.Generator().manual_seed(0)
def step(tokens):
    loc = torch.randperm(95, generator=g)[:tokens] + 1
    for layer in range(3):
        k = torch.randn(tokens, 2, 64, generator=g).bfloat16()
        pool.set_kv_buffer(Layer(layer), loc, k, k * 2, None, None)
step(4)  # eager, as SGLang's warm-up runs before it captures
graphs = {}
for bs in (8, 16):
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin()
    step(bs)
    graph.capture_end()
    graphs[bs] = graph
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for bs in (8, 16, 8):
        graphs[bs].replay()
prof.export_chrome_trace(os.path.join(out, "1790857026.5-TP-0.trace.json.gz"))
json.dump({"hooked": hooked}, open(os.path.join(out, "result.txt"), "w"))
'''

# A model's forward steps as SGLang runs them, for the write ledger: SGLang's own forward_context
# (what ModelRunner._forward_raw opens around every forward), ForwardBatch, RadixAttention and
# MHATokenToKVPool. What stands in is the attention backend, whose forward writes K/V through
# set_kv_buffer when asked to save them, as SGLang's backends do. One prefill of 5 tokens and two
# decode steps over 3 layers. MODE "seen": every layer saves through the backend. MODE "bypass":
# layer 1 writes its own K/V into its buffers (as a model's fused kernel kvprof does not hook) and
# calls its attention with save_kv_cache=False.
LEDGER_SCENARIO = r'''
import json, os, sys, torch
out = sys.argv[1]
MODE = "%s"
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.plugins import load_plugins

load_plugins()
import sglang.srt.model_executor.forward_context as fc
hooked = forward_context is fc.forward_context and hasattr(fc.forward_context, "__wrapped__")
pool = MHATokenToKVPool(size=96, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64, layer_num=3,
                        device="cpu", enable_memory_saver=False)

class Backend:  # the stand-in: SGLang's backends save K/V through set_kv_buffer unless told not to
    token_to_kv_pool = pool
    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if save_kv_cache:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        return q

layers = [RadixAttention(2, 64, 0.125, 2, layer_id=i) for i in range(3)]
g = torch.Generator().manual_seed(0)
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    start = 1
    for mode, tokens in ((ForwardMode.EXTEND, 5), (ForwardMode.DECODE, 1), (ForwardMode.DECODE, 1)):
        loc = torch.arange(start, start + tokens)
        start += tokens
        batch = ForwardBatch(forward_mode=mode, batch_size=1, input_ids=torch.zeros(tokens, dtype=torch.long),
                             req_pool_indices=torch.zeros(1, dtype=torch.long), seq_lens=torch.tensor([start - 1]),
                             out_cache_loc=loc, seq_lens_sum=start - 1)
        with forward_context(ForwardContext(attn_backend=Backend()), forward_batch=batch):
            for attn in layers:
                k = torch.randn(tokens, 2, 64, generator=g).bfloat16()
                v = torch.randn(tokens, 2, 64, generator=g).bfloat16()
                q = torch.randn(tokens, 128, generator=g).bfloat16()
                save = True
                if MODE == "bypass" and attn.layer_id == 1:
                    pool.k_buffer[1][loc], pool.v_buffer[1][loc] = k, v
                    save = False
                attn(q, k, v, batch, save_kv_cache=save)
prof.export_chrome_trace(os.path.join(out, "1790857026.5-TP-0.trace.json.gz"))
written = all(bool(b[1:8].view(torch.uint8).any()) for b in pool.k_buffer + pool.v_buffer)
json.dump({"hooked": hooked, "written": written}, open(os.path.join(out, "result.txt"), "w"))
'''

# The fork server: imports what the scenarios import of SGLang (never kvprof's plugin, never
# load_plugins()), then for each request line {"script", "args", "env", "log"} forks a child that
# takes that environment and argv, sends stdout and stderr to the log and runs the script as
# __main__; the server answers each request with the child's exit code. The child's environment
# is the request's alone, so what kvprof's plugin reads at load_plugins() is what a fresh process
# would see; only what the server itself was started with (TRITON_INTERPRET, PYTHONWARNINGS,
# read at import and at start-up) is shared, and every scenario sets those the same.
FORK_SERVER = r'''
import json, os, runpy, sys
import torch
import sglang.srt.mem_cache.memory_pool, sglang.srt.plugins
import sglang.kernels.ops.attention.rope
import sglang.srt.layers.rotary_embedding.factory, sglang.srt.model_executor.forward_context
import sglang.srt.models.utils, sglang.srt.layers.radix_attention, sglang.srt.model_executor.forward_batch_info
assert not any(m == "kvprof" or m.startswith("kvprof.") for m in sys.modules), "the server imported kvprof"
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the child ends as a script does: exit code, threads joined, atexit handlers run
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["script"], *req["args"]]
        runpy.run_path(req["script"], run_name="__main__")
        raise SystemExit(0)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
'''
SERVER_ENV = {"TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}


class ForkServer:
    def __init__(self, folder: Path) -> None:
        script = folder / "fork_server.py"
        script.write_text(FORK_SERVER)
        self.proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, **SERVER_ENV},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready", \
            "the fork server did not start"

    def run(self, script: Path, args: list[str], env: dict[str, str], log: Path) -> tuple[int, str]:
        """Run ``script`` in a child forked from the server; its exit code and its output."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert all(env.get(k) == v for k, v in SERVER_ENV.items()), "a scenario's environment differs from the server's"
        self.proc.stdin.write(json.dumps({"script": str(script), "args": args, "env": env, "log": str(log)}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the fork server died"
        return int(answer), log.read_text() if log.exists() else ""

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    forks = ForkServer(tmp_path_factory.mktemp("fork_server"))
    try:
        yield forks
    finally:
        forks.close()


def _scenario(server: ForkServer, tmp_path: Path, writer: str | None, code: str = SCENARIO,
              extra: dict[str, str] | None = None) -> tuple[dict, Path]:
    prof = tmp_path / "sglang_profile"
    prof.mkdir()
    script = tmp_path / "scenario.py"
    script.write_text(code)
    env = {**os.environ, "KVPROF_SGLANG": "1", "SGLANG_PLUGINS": "kvprof", "KVPROF_SGLANG_DIR": str(prof),
           **SERVER_ENV, **(extra or {})}
    env.pop("KVPROF_SGLANG_WRITER", None)
    if not extra or "KVPROF_SGLANG_SHADOW" not in extra:
        env.pop("KVPROF_SGLANG_SHADOW", None)
    if writer:
        env["KVPROF_SGLANG_WRITER"] = writer
    returncode, output = server.run(script, [str(prof)], env, tmp_path / "scenario.log")
    assert returncode == 0, output[-4000:]
    result = json.loads((prof / "result.txt").read_text())
    (prof / "result.txt").unlink()
    return result, prof


def _range_names(trace: Path) -> list[str]:
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["name"] for e in events if str(e.get("name", "")).startswith("set_kv_buffer[")]


@pytest.mark.parametrize("writer", [None, "triton_fused"])
def test_plugin_in_sglang_pool(server: ForkServer, tmp_path: Path, writer: str | None,
                               capsys: pytest.CaptureFixture[str]):
    result, prof = _scenario(server, tmp_path, writer)
    assert result["hooked"], "load_plugins() did not apply kvprof's hook"
    assert result["written"], "the writes did not land"
    assert result["same"], "the plugin changed what landed in the cache"

    variant = writer or "sglang_mha"
    names = _range_names(prof / "1790857026.5-TP-0.trace.json.gz")
    plain = 18  # 3 steps x 3 layers x 2 pools, each call one range
    assert len(names) == plain + (1 if writer else 0)
    assert sorted(set(names)) == sorted({f"set_kv_buffer[{variant}] L{i}" for i in range(3)}
                                        | ({"set_kv_buffer[sglang_mha] L2"} if writer else set()))

    sidecars = list(prof.glob("kvprof-sglang.TP-0.pid-*.json"))
    assert len(sidecars) == 1
    side = json.loads(sidecars[0].read_text())
    assert side["sglang_version"] and side["tp_rank"] == 0 and side["writer"] == writer
    # SGLang 0.5.23's bypass paths, the ledger's step and the attention call that names them are
    # hooked on its real package
    assert {"bf16_rope_scale_store", "fused_fp8_qkv_kv_cache", "fused_qk_norm_rope_swa_store",
            "HPCOpsAttnBackend.fused_qk_rope_store_kv_fp8", "forward_context",
            "RadixAttention.forward"} <= set(side["hooked"])
    assert side["engine"] == "sglang" and side["schema"] == "kvprof.engine_sidecar/1"
    assert {p["dtype"] for p in side["pools"]} == {"bf16", "fp8_e4m3"}
    assert all(p["class"] == "MHATokenToKVPool" and p["native_path"] == "index_put" for p in side["pools"])
    if writer:
        # pool B's 18 writes through the writer; the float64 call fell back, with its reason
        assert side["paths"] == {"writer:triton_fused:fused": 18, "sglang:fallback": 1,
                                 "sglang:sglang_mha": 1}
        assert len(side["fallbacks"]) == 1 and "float64" in next(iter(side["fallbacks"]))
    else:
        assert side["paths"] == {"sglang:sglang_mha": 18}

    out = tmp_path / "analysis"
    assert main(["analyze", str(prof), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # as wrapped at any width
    assert "kvprof write ranges outside kvprof steps" in printed
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["variant"]: r for r in summary["write_kernels"]["stepless_writes"]}
    assert rows[variant]["writes"] == 18 and rows[variant]["layers"] == 3 and rows[variant]["rank"] == 0
    assert rows[variant]["host_ns"] > 0
    assert summary["write_kernels"]["sidecars"][0]["paths"] == side["paths"]
    import pandas as pd

    writes = pd.read_parquet(out / "writes.parquet")
    assert (writes["variant"] == variant).sum() == 18
    assert sorted(writes.loc[writes["variant"] == variant, "layer"].unique().tolist()) == [0, 1, 2]


# SGLang's canary reporter (sglang.srt.kv_canary.runner.violation_reporter, log mode) reporting one
# violation as its verify kernel leaves it in the ring: what the plugin's canary hook reads
CANARY = r'''
from types import SimpleNamespace
from sglang.kernels.ops.kv_canary.consts import FailReason
from sglang.srt.kv_canary.config import CanaryMode
from sglang.srt.kv_canary.runner.violation_reporter import ViolationReporter
ring = torch.zeros(1024, 8, dtype=torch.int64)
ring[0] = torch.tensor([2, 17, 5, 11, 12, 0, 0, int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)])
log = SimpleNamespace(violation_log=SimpleNamespace(violation_write_index=torch.tensor([1]), violation_ring=ring))
ViolationReporter(config=SimpleNamespace(mode=CanaryMode.LOG), device_state=log).log_or_raise_violation(
    outer_step_counter=3)
'''


@pytest.mark.parametrize("writer", [None, "triton_fused", "planted_writers:off_by_one"])
def test_shadow_check_in_sglang_pool(server: ForkServer, tmp_path: Path, writer: str | None,
                                     capsys: pytest.CaptureFixture[str]):
    """KVPROF_SGLANG_SHADOW=1 on SGLang's real MHATokenToKVPool (bf16, and fp8 with scale 2 from bf16
    rows): every write's rows compared with its inputs. SGLang's own write and kvprof's
    triton_fused pass; verify's plant ``off_by_one`` (rows at slot + 1) named as
    KVPROF_SGLANG_WRITER is caught on every write it takes, and analyze says so in red and in its
    warnings. The float64 call a writer cannot take is SGLang's, and checked as SGLang's. SGLang's own
    canary reporter, run in the same process over one violation, has it read into the sidecar."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n" + SCENARIO + CANARY  # planted_writers
    result, prof = _scenario(server, tmp_path, writer, code, {"KVPROF_SGLANG_SHADOW": "1"})
    assert result["hooked"] and result["written"]
    (sidecar,) = prof.glob("kvprof-sglang.TP-0.pid-*.json")
    side = json.loads(sidecar.read_text())
    shadow = side["shadow"]
    writes = 18 + (1 if writer else 0)
    rows = 2 * 3 * (1 + 4 + 7) + (3 if writer else 0)  # 2 pools x 3 layers x the steps' tokens, + the float64 call
    assert (shadow["every"], shadow["writes"], shadow["sampled"], shadow["checked"]) == (1, writes, writes, writes)
    assert shadow["rows_checked"] == rows and shadow["skipped"] == {}
    planted = writer == "planted_writers:off_by_one"
    assert result["same"] is not planted
    if planted:
        assert side["paths"]["writer:off_by_one:planted"] == 18
        assert shadow["mismatched"] == 18 and shadow["rows_mismatched"] == rows - 3
        assert {m["variant"] for m in shadow["first_mismatches"]} == {"off_by_one"}
        assert {m["layer"] for m in shadow["first_mismatches"]} <= {0, 1, 2}
    else:
        assert shadow["mismatched"] == 0 and shadow["first_mismatches"] == []
    out = tmp_path / "analysis"
    assert main(["analyze", str(prof), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"{writes} writes checked ({rows} rows), {18 if planted else 0} mismatched" in printed
    summary = json.loads((out / "summary.json").read_text())
    from kvprof.report.write_kernels import shadow_cell  # the plugin table's column (dropped when narrow)

    assert shadow_cell(summary["write_kernels"]["sidecars"][0]["shadow"]) == \
        f"1 in 1: {writes} checked, {'18 WRONG' if planted else '0 wrong'}, 0 skipped"
    warnings = summary["warnings"]
    assert any("KV ROWS DIFFER FROM THE WRITE'S INPUTS in 18 writes" in w for w in warnings) is planted
    # SGLang's own canary, its reporter in log mode over one violation: read through the plugin's hook
    assert side["canary"]["violations"] == 1 and "slot_idx=17" in side["canary"]["first"][0]
    assert any("SGLang's KV canary" in w and "1 VIOLATIONS" in w for w in warnings)


@pytest.mark.parametrize("writer", [None, "rope_triton_fused"])
def test_fused_rope_writes_counted_ranged_and_routed(server: ForkServer, tmp_path: Path, writer: str | None,
                                                     capsys: pytest.CaptureFixture[str]):
    """A fused-rope model's writes never call set_kv_buffer: the rope hook counts and ranges
    them per layer, and KVPROF_SGLANG_WRITER=rope_triton_fused (Triton's interpreter here)
    writes what SGLang's path writes: the pool and the rotated q/k bit for bit against the
    stand-in, kvprof's float32 reference rounded once to bf16."""
    result, prof = _scenario(server, tmp_path, writer, ROPE_SCENARIO)
    assert result["hooked"], "load_plugins() did not hook SGLang's rope + store function"
    assert result["written"], "the writes did not land"
    assert result["same"] and result["same_qk"], "the plugin changed what landed or how q/k were rotated"

    layers, steps = 3, 3
    variant = writer or "sglang_fused_rope"
    names = _range_names(prof / "1790857026.5-TP-0.trace.json.gz")
    assert len(names) == layers * steps  # the rope-only calls have no range
    assert sorted(names) == sorted(f"set_kv_buffer[{variant}] L{i}" for i in range(layers) for _ in range(steps))

    (sidecar,) = prof.glob("kvprof-sglang.TP-0.pid-*.json")
    side = json.loads(sidecar.read_text())
    assert "apply_rope_with_cos_sin_cache_inplace" in side["hooked"] and side["writer"] == writer
    assert side["write_paths"] == {"fused into rope": layers * steps}
    assert side["paths"] == ({f"writer:{writer}:fused_into_rope": 9} if writer else {"sglang:fused_into_rope": 9})
    assert not side["fallbacks"] and not side["unattributed"]
    (pool,) = side["pools"]
    assert pool["class"] == "MHATokenToKVPool" and pool["native_path"] == "fused_into_rope"

    out = tmp_path / "analysis"
    assert main(["analyze", str(prof), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # as wrapped at any width
    assert "fused into rope" in printed
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["write_kernels"]["stepless_writes"]
    assert (row["variant"], row["writes"], row["layers"], row["rank"]) == (variant, layers * steps, layers, 0)


@pytest.mark.parametrize("mode", ["seen", "bypass"])
def test_write_ledger_in_sglang_forward_steps(server: ForkServer, tmp_path: Path, mode: str,
                                              capsys: pytest.CaptureFixture[str]):
    """The ledger on SGLang's real package, its step from SGLang's own forward_context: every write
    seen (7 tokens x 3 layers over 3 steps), or layer 1's 7 tokens unseen and named by its
    save_kv_cache=False calls; analyze prints the verdict."""
    result, prof = _scenario(server, tmp_path, None, LEDGER_SCENARIO % mode)
    assert result["hooked"], "load_plugins() did not hook forward_context where ModelRunner imports it from"
    assert result["written"], "the writes did not land"
    (sidecar,) = prof.glob("kvprof-sglang.TP-0.pid-*.json")
    side = json.loads(sidecar.read_text())
    assert {"forward_context", "RadixAttention.forward"} <= set(side["hooked"])
    ledger = side["ledger"]
    assert (ledger["steps"], ledger["graph_steps"]) == (3, 0)
    assert ledger["expected"] == {"0": 7, "1": 7, "2": 7}
    assert main(["analyze", str(prof), "--no-files"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # as wrapped at any width
    if mode == "seen":
        assert ledger["seen"] == ledger["expected"] and ledger["unseen_paths"] == {}
        assert side["paths"] == {"sglang:sglang_mha": 9}
        assert "every write was seen: 21 tokens asked of 3 layers over 3 steps" in printed
    else:
        assert ledger["seen"] == {"0": 7, "2": 7}
        assert ledger["unseen_paths"] == {"save_kv_cache=False L1: the model writes K/V itself": 7}
        assert side["paths"] == {"sglang:sglang_mha": 6}
        assert "7 of 21 tokens asked were written where no hook saw them, over 3 steps" in printed
        assert "save_kv_cache=False L1: the model writes K/V itself (7 tokens)" in printed


def test_plugin_off_without_the_variable(server: ForkServer, tmp_path: Path):
    """Installed but not asked for: SGLang's classes stay untouched."""
    script = tmp_path / "off.py"
    script.write_text("from sglang.srt.plugins import load_plugins\n"
                      "from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool\n"
                      "load_plugins(); print(hasattr(MHATokenToKVPool.set_kv_buffer, '__wrapped__'))\n")
    env = {**{k: v for k, v in os.environ.items() if k != "KVPROF_SGLANG"}, **SERVER_ENV}
    returncode, output = server.run(script, [], env, tmp_path / "off.log")
    assert returncode == 0, output[-2000:]
    assert output.strip().splitlines()[-1] == "False"


def test_graph_captures_recorded_in_sglang_pool(server: ForkServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The writes captured into each graph, in order, with SGLang's path and its kernel (index_put
    on a CPU: two kernels per write), and each replay inside a kvprof.graph_replay[<graph>] range;
    the sidecar names the CPU as the device (no peak) and analyze reads the folder."""
    result, prof = _scenario(server, tmp_path, None, GRAPH_SCENARIO)
    assert result["hooked"], "load_plugins() did not hook torch.cuda.CUDAGraph"
    (sidecar,) = prof.glob("kvprof-sglang.TP-0.pid-*.json")
    side = json.loads(sidecar.read_text())
    assert side["graph_hook"] == "torch.cuda.graphs.CUDAGraph.{capture_begin,capture_end,replay}"
    assert [(g["graph"], [(w["layer"], w["tokens"], w["path"], w["kernel"], w["kernels"]) for w in g["writes"]])
            for g in side["graphs"]] == [
        (n, [(layer, bs, "sglang:sglang_mha", "index_put", 2) for layer in range(3)]) for n, bs in ((0, 8), (1, 16))]
    assert side["paths"] == {"sglang:sglang_mha": 9} and side["graphs_without_writes"] == 0
    assert side["device"]["type"] == "cpu" and side["device"]["peak_bandwidth_gbs"] is None
    with gzip.open(prof / "1790857026.5-TP-0.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert [e["name"] for e in events if str(e.get("name", "")).startswith("kvprof.graph_replay")] == [
        "kvprof.graph_replay[0]", "kvprof.graph_replay[1]", "kvprof.graph_replay[0]"]
    assert main(["analyze", str(prof), "--no-files"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # as wrapped at any width
    assert "sglang_mha: not fused · paths say not fused (two_copies x9, from the SGLang plugin)" in printed
