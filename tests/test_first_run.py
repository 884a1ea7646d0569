"""A new user's first run and daily use on a CPU: `capture --context layer` with its defaults,
the memory guard that names what fits, and hints that say what to do."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys

import orjson
import pytest
import torch

from cli_support import run_cli, run_kvprof
from kvprof.capture.config import CaptureConfig
from kvprof.capture.defaults import (
    CPU_DEFAULT_LAYERS,
    CPU_LAYER_CONTEXT_LEN,
    CPU_LAYER_DECODE_SIZES,
    CPU_LAYER_PREFILL_TOKENS,
    CPU_LAYER_REFERENCE_STEPS,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_DECODE_SIZES,
    DEFAULT_PREFILL_TOKENS,
)
from kvprof.core.errors import ResourceError, UsageError, rendered

CPU = torch.device("cpu")


# -- --context layer's defaults on a CPU -----------------------------------------------------
def test_layer_context_on_a_cpu_resolves_to_small_settings_and_names_them():
    cpu = CaptureConfig(context="layer").validate().resolved_for("cpu")
    assert cpu.layers == CPU_DEFAULT_LAYERS and cpu.context_len == CPU_LAYER_CONTEXT_LEN
    assert cpu.decode_sizes == list(CPU_LAYER_DECODE_SIZES) and cpu.prefill_sizes == [CPU_LAYER_PREFILL_TOKENS]
    assert cpu.reference_steps == CPU_LAYER_REFERENCE_STEPS
    assert set(cpu.device_defaults) >= {"layers", "context_len", "decode_sizes", "prefill_sizes", "reference_steps"}
    # the manifest's config.resolved records them, and a child process reads them back
    doc = orjson.loads(orjson.dumps(cpu.as_dict()))
    assert doc["resolved"]["device_defaults"]["context_len"] == CPU_LAYER_CONTEXT_LEN
    assert "device_defaults" not in doc
    assert CaptureConfig.from_dict(doc) == cpu
    # on CUDA the engine's sizes and every layer, as before
    gpu = CaptureConfig(context="layer").validate().resolved_for("cuda")
    assert (gpu.layers, gpu.context_len, gpu.decode_sizes, gpu.prefill_sizes) == (
        80, DEFAULT_CONTEXT_LEN, list(DEFAULT_DECODE_SIZES), [DEFAULT_PREFILL_TOKENS])


def test_options_given_are_kept_and_not_reported_as_defaults():
    given = CaptureConfig(context="layer", layers=3, context_len=64, decode_sizes=[4], prefill_sizes=[8],
                          reference_steps=5).validate().resolved_for("cpu")
    assert (given.layers, given.context_len, given.decode_sizes, given.prefill_sizes, given.reference_steps) == (
        3, 64, [4], [8], 5)
    assert not {"layers", "context_len", "decode_sizes", "prefill_sizes",
                "reference_steps"} & set(given.device_defaults)
    # the writes alone keep the GPU's sizes on a CPU: only the layer context's are smaller
    plain = CaptureConfig().validate().resolved_for("cpu")
    assert plain.context_len == DEFAULT_CONTEXT_LEN and plain.prefill_sizes == [DEFAULT_PREFILL_TOKENS]


def test_the_console_line_names_each_cpu_default():
    from kvprof.capture.plan import resolve
    from kvprof.capture.run import defaults_line
    from kvprof.commands.capture import flags

    line = defaults_line(resolve(CaptureConfig(context="layer"), CPU))
    assert line is not None
    shown = rendered(line, flags())  # as the command line prints it: each setting as its flag
    for part in (f"--layers {CPU_DEFAULT_LAYERS} (of 80)", f"--context-len {CPU_LAYER_CONTEXT_LEN}",
                 f"--prefill-tokens {CPU_LAYER_PREFILL_TOKENS}",
                 f"--reference-steps {CPU_LAYER_REFERENCE_STEPS} to 100 (on while a point's steps took under 0.5 s)"):
        assert part in shown
    # through the Python API, the fields a CaptureConfig is given
    assert f"context_len {CPU_LAYER_CONTEXT_LEN}" in str(line) and "--" not in str(line)
    assert defaults_line(resolve(CaptureConfig(context="layer"), torch.device("cuda"))) is None
    assert defaults_line(resolve(CaptureConfig(), CPU)) is None  # the writes alone


# -- the memory guard counts the layers a step builds, and names what fits ------------------
def test_the_layer_context_builds_only_the_layers_a_step_runs():
    from kvprof.kvcache.layer import DecoderContext, layer_weight_bytes, weight_bytes

    shape = CaptureConfig(model="small=6x2x64", tp=1).rank_shape()
    ctx = DecoderContext(shape, torch.float32, CPU, 4, layers=2)
    assert len(ctx.layers) == 2
    per_layer, fixed = layer_weight_bytes(shape, torch.float32)
    built = sum(t.numel() * t.element_size() for w in ctx.layers for t in dataclasses.astuple(w))
    assert built == 2 * per_layer and weight_bytes(shape, torch.float32, 2) == 2 * per_layer + fixed
    with pytest.raises(UsageError, match="built for 2"):
        loc = torch.tensor([1])
        ctx.step(loc, None, [0, 1, 2], lambda i: (torch.empty(0), torch.empty(0)), decode=False)


def test_the_guard_names_the_layers_that_fit():
    from kvprof.capture.plan import make_context, resolve
    from kvprof.commands.capture import flags
    from kvprof.kvcache.layer import layer_weight_bytes

    config = CaptureConfig(context="layer", layers=80, max_memory_gb=1.0).validate().resolved_for("cpu")
    per_layer, fixed = layer_weight_bytes(config.rank_shape(), config.input_torch_dtype())
    fits = ((1 << 30) - fixed) // per_layer
    assert 1 <= fits < 80
    with pytest.raises(ResourceError, match=rf"builds 80 layers of weights.*layers {fits} fits") as err:
        make_context(resolve(config, CPU))
    assert re.search(rf"\. --layers {fits} fits", rendered(err.value, flags()))  # the command line's words
    # not even one layer: a smaller model or a larger --tp
    tiny_limit = dataclasses.replace(config, layers=1, max_memory_gb=0.01)
    with pytest.raises(ResourceError, match="smaller model or a larger tp") as err:
        make_context(resolve(tiny_limit, CPU))
    assert "smaller --model or a larger --tp" in rendered(err.value, flags())


@pytest.mark.slow
def test_capture_context_layer_with_its_defaults_finishes_on_a_cpu(tmp_path):
    """The first run the README times: the defaults alone, on a CPU, within two minutes."""
    done = run_kvprof("capture", "--context", "layer", "--device", "cpu", "--no-progress", "--out", str(tmp_path),
                      "--run-id", "first", timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"--context-len {CPU_LAYER_CONTEXT_LEN}" in done.stderr
    manifest = orjson.loads((tmp_path / "first" / "manifest.json").read_bytes())
    cfg = manifest["config"]
    assert cfg["context"] == "layer" and cfg["layers"] == CPU_DEFAULT_LAYERS
    assert cfg["resolved"]["device_defaults"]["reference_steps"] == CPU_LAYER_REFERENCE_STEPS
    assert "each write inside a decoder layer" in " ".join(done.stdout.split())


# -- hints that say what to do ------------------------------------------------------------------
def test_variants_prints_the_install_hint_whole(capsys, monkeypatch):
    """Rich reads "[triton]" as a tag: printed as markup the extra's name was lost."""
    from kvprof.kvcache.writers.triton_fused import INSTALL_HINT, TritonFusedWriter

    monkeypatch.setattr(TritonFusedWriter, "unsupported_reason", lambda self, *a, **k: f"no triton: {INSTALL_HINT}")
    monkeypatch.setenv("COLUMNS", "400")
    rc, out, _ = run_cli(capsys, "variants", "--device", "cpu")
    assert rc == 0
    assert "pip install 'kvcache-profiler[triton]'" in out


def test_store_kv_fused_is_marked_interpreted_where_its_triton_kernel_is(capsys, monkeypatch):
    from kvprof.kvcache.writers.store_kv_fused import StoreKVFusedWriter
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    if not TritonFusedWriter().info().extra.get("interpreted"):
        pytest.skip("Triton's interpreter is not on in this process")
    assert StoreKVFusedWriter().info().extra.get("interpreted")
    monkeypatch.setenv("COLUMNS", "400")
    rc, out, _ = run_cli(capsys, "variants", "--device", "cpu")
    assert rc == 0 and "store_kv_fused *" in out and "triton_fused *" in out
    assert "* runs its Triton kernel in Triton's interpreter" in " ".join(out.split())


def test_the_dashboard_hint_asks_for_the_extra_only_when_it_is_missing(monkeypatch):
    from kvprof.report import verdict

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in ("streamlit", "plotly")
                        else real(name, *a))
    assert verdict.dashboard_hint() == "python -m kvprof dashboard"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    assert "pip install" in verdict.dashboard_hint() and "[dashboard]" in verdict.dashboard_hint()


def test_bench_sets_triton_interpret_on_a_cpu_as_capture_does():
    """bench imports kvprof's Triton writers after deciding the interpreter, as capture does."""
    code = ("import argparse, os\n"
            "from kvprof.commands import bench\n"
            "from kvprof.core.errors import UsageError\n"
            "p = argparse.ArgumentParser(); bench.add_arguments(p)\n"
            "try:\n"
            "    bench.run(p.parse_args(['--device', 'cpu', '--shapes', '1x2x64']))  # refused after the imports\n"
            "except UsageError:\n"
            "    pass\n"
            "print(os.environ.get('TRITON_INTERPRET'))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "1", done.stderr[-1500:]


def test_importing_the_dashboard_outside_streamlit_logs_no_runtime_warnings():
    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-c", "import kvprof.dashboard.data, kvprof.dashboard.app"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    assert "No runtime found" not in done.stderr
