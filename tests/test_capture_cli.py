"""`python -m kvprof capture` end to end on CPU, and every kind of bad input it must refuse cleanly."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from cli_support import end, kvprof_child, run_cli
from kvprof.capture.defaults import CPU_DEFAULT_LAYERS
from kvprof.cli import main

SMALL = ["--model", "llama-3.1-70b", "--tp", "8", "--batch-sizes", "1,4", "--prefill-tokens", "64",
         "--steps", "2", "--warmup", "1", "--no-progress"]


def test_capture_writes_a_complete_run_dir(tmp_path, capsys):
    rc, printed, _ = run_cli(capsys, "capture", *SMALL, "--variants", "index_put,two_stream", "--out", str(tmp_path),
                             "--run-id", "r1")
    assert rc == 0
    run = tmp_path / "r1"
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    assert manifest["config"]["model"] == "llama-3.1-70b"
    assert manifest["config"]["resolved"]["shape"] == {
        "model": "llama-3.1-70b", "tp": 8, "layers": 80, "head_num": 1, "head_dim": 128, "v_head_dim": 128,
        "hidden": 8192, "q_head_num": 8, "intermediate": 3584}
    # on a CPU a step writes the first CPU_DEFAULT_LAYERS of the 80 layers, with one torch thread
    assert manifest["config"]["layers"] == CPU_DEFAULT_LAYERS and manifest["config"]["threads"] == 1
    for v in ("index_put", "two_stream"):
        entry = manifest["variants"][v]
        assert entry["available"] and entry["files"]["torch_trace"] == f"{v}.pt.trace.json.gz"
        # layers x (2 decode sizes + 1 prefill) x 2 steps, and on CPU two copies each
        assert entry["paths"] == {"two_copies": CPU_DEFAULT_LAYERS * 3 * 2}
        assert entry["fused"]["state"] == "not fused"
        trace = orjson.loads(gzip.decompress((run / entry["files"]["torch_trace"]).read_bytes()))
        assert trace["kvprof"]["variant"] == v and trace["kvprof"]["layers"] == list(range(CPU_DEFAULT_LAYERS))
        assert trace["kvprof"]["model"]["layers"] == 80
        names = {e.get("name") for e in trace["traceEvents"]}
        assert f"set_kv_buffer[{v}] L{CPU_DEFAULT_LAYERS - 1}" in names and "kvprof.step[decode bs=4] #1" in names
        # prof.step() per measured step: the iterations HolisticTraceAnalysis looks for
        assert {f"ProfilerStep#{i}" for i in range(6)} <= names
    for out in ("summary.json", "summary.csv", "events.parquet", "writes.parquet"):
        assert (run / out).is_file()
    summary = orjson.loads((run / "summary.json").read_bytes())
    assert set(summary["variants"]) >= {"index_put", "two_stream"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    assert "run directory" in printed


def test_first_run_on_cpu_fuses_in_triton_interpreter_and_fits_80_columns(tmp_path):
    """The README's first command, shrunk to a few seconds: the default variants on a CPU with
    TRITON_INTERPRET unset; kvprof sets it, triton_fused runs fused, the output teaches and
    fits 80 columns, and what was skipped says why."""
    proc = kvprof_child("capture", "--batch-sizes", "1", "--prefill-tokens", "16", "--steps", "2", "--warmup", "1",
                        "--no-progress", "--out", str(tmp_path), "--run-id", "first",
                        env={"TRITON_INTERPRET": None, "COLUMNS": "80", "PYTHONUNBUFFERED": "1"})
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        end(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "profiler_start" not in err.decode() and "profiler_stop" not in err.decode()  # Kineto's markers
    text = out.decode()
    # every line rich wraps fits; the last one is the run folder's path, left whole to copy
    lines = text.splitlines()
    assert lines[-1].startswith("run directory: ") and "…" not in text
    assert max(len(line) for line in lines[:-1]) <= 80
    flat = " ".join(text.split())
    assert "What this run says" in flat and "fused (one launch writes K and V): triton_fused" in flat
    assert "Triton's interpreter (TRITON_INTERPRET=1, set by kvprof)" in flat
    assert f"each step wrote {CPU_DEFAULT_LAYERS} of the model's 80 layers" in flat
    assert "python -m kvprof dashboard" in flat and "python -m kvprof analyze" in flat
    row = next(line.split() for line in text.splitlines() if line.split()[:2] == ["triton_fused", "*"])
    # no ratio or saving derived from the interpreter's time (kvprof.analysis.figures)
    assert row[2:5] == ["yes", "decode", "1"] and row[6] == "ref" and row[-4:] == ["n/a", "(*)", "n/a", "(*)"]
    manifest = orjson.loads((tmp_path / "first" / "manifest.json").read_bytes())
    assert manifest["config"]["resolved"]["triton_interpret"] == "set by kvprof"
    tf = manifest["variants"]["triton_fused"]
    assert tf["available"] and tf["interpreted"] is True and tf["fused"]["state"] == "fused"
    assert "interpreted" not in manifest["variants"]["two_stream"]
    sgl = manifest["variants"]["sgl_kernel"]
    assert sgl["available"] is False and "sgl-kernel" in sgl["reason"]
    assert manifest["variants"]["cuda_fused"]["available"] is False
    cubin = manifest["variants"]["sgl_kernel_cubin"]
    assert cubin["available"] is False and "needs CUDA" in cubin["reason"]
    # on a CPU store_kv_fused is triton_fused's kernel: not run twice unless named
    assert "runs triton_fused's kernel" in manifest["variants"]["store_kv_fused"]["reason"]


@pytest.mark.gpu
def test_first_run_on_a_gpu_writes_every_layer_with_compiled_kernels(tmp_path, capsys):
    """The same first command on a CUDA GPU (run with TRITON_INTERPRET=0, as gpu/run_gpu_checks.sh
    does): all 80 layers, no interpreter, and savings per decode step in the compact table."""
    from kvprof.kvcache.writers import triton_kernel

    if triton_kernel.interpreted():
        pytest.skip("triton_fused was imported under TRITON_INTERPRET=1; run with TRITON_INTERPRET=0")
    rc, out, _ = run_cli(capsys, "capture", "--batch-sizes", "1,10", "--prefill-tokens", "64", "--steps", "3",
                         "--warmup", "1", "--reference-steps", "20", "--variants", "index_put,two_stream,triton_fused",
                         "--no-progress", "--out", str(tmp_path), "--run-id", "g")
    assert rc == 0
    manifest = orjson.loads((tmp_path / "g" / "manifest.json").read_bytes())
    assert manifest["config"]["layers"] == 80 and manifest["config"]["resolved"]["triton_interpret"] is None
    assert "interpreted" not in manifest["variants"]["triton_fused"]
    flat = " ".join(out.split())
    assert "each step wrote 80 of the model's 80 layers" in flat and "interpreter" not in flat
    row = next(line.split() for line in out.splitlines() if line.split()[:4] == ["triton_fused", "yes", "decode", "10"])
    float(row[-1])  # a saving per decode step in ms, not n/a


def test_layers_and_threads_reach_the_manifest_and_projections_use_the_model(tmp_path, capsys):
    rc, _, _ = run_cli(capsys, "capture", *SMALL, "--variants", "index_put,two_stream", "--layers", "3",
                       "--threads", "2", "--phase", "decode", "--out", str(tmp_path), "--run-id", "l3")
    assert rc == 0
    manifest = orjson.loads((tmp_path / "l3" / "manifest.json").read_bytes())
    assert manifest["config"]["layers"] == 3 and manifest["config"]["threads"] == 2
    assert manifest["variants"]["index_put"]["paths"] == {"two_copies": 3 * 2 * 2}
    summary = orjson.loads((tmp_path / "l3" / "summary.json").read_bytes())
    assert summary["comparison"]["layers"] == 80  # savings per step: the model's 80 layers, not 3
    ref = [g for g in summary["groups"] if g["source"] == "reference"]
    assert ref and all(g["writes"] == g["steps"] * 3 for g in ref)  # cost per write: a step over its 3 writes


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--model", "gpt-17"], 2, "unknown model 'gpt-17'"),
        (["--variants", "nope"], 2, "unknown variant 'nope'"),
        (["--device", "tpu"], 2, "unknown device 'tpu'"),
        (["--device", "cuda"], 4, "--device cuda asked for"),
        (["--variants", "cuda_fused"], 4, "variant cuda_fused cannot run on cpu"),
        (["--variants", "sgl_kernel", "--device", "cpu"], 4, "sgl-kernel"),
        (["--steps", "0"], 2, "argument --steps: expected a positive integer"),
        (["--cache-dtype", "int4"], 2, "unknown dtype 'int4'"),
        (["--phase", "train"], 2, "unknown phase 'train'"),
        (["--slots", "paged"], 2, "needs --page-size"),
        (["--tp", "0"], 2, "argument --tp: expected a positive integer"),
        (["--profiler", "nsys"], 5, "nsys"),
        (["--layers", "0"], 2, "argument --layers: expected a positive integer"),
        (["--layers", "81"], 2, "llama-3.1-70b has 80 layers"),
        (["--context", "layer", "--layers", "80", "--max-memory-gb", "1"], 2, "builds 80 layers of weights"),
        (["--threads", "0"], 2, "argument --threads: expected a thread count from 1 to"),
    ],
)
def test_bad_input_is_one_line_and_a_code(tmp_path, capsys, monkeypatch, args, code, message):
    monkeypatch.setenv("KVPROF_NSYS", str(tmp_path / "no-nsys-here"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    rc, _, stderr = run_cli(capsys, "capture", *SMALL, "--out", str(tmp_path / "out"), *args)
    err = stderr.strip().splitlines()
    assert rc == code
    assert err and message in err[-1] and err[-1].startswith("kvprof capture: error:")
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_unwritable_output(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc, _, err = run_cli(capsys, "capture", *SMALL, "--variants", "index_put", "--out", str(blocker / "sub"))
    assert rc == 6
    assert "kvprof capture: error:" in err


def test_existing_run_id_is_refused(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    rc, _, err = run_cli(capsys, "capture", *SMALL, "--variants", "index_put", "--out", str(tmp_path),
                         "--run-id", "taken")
    assert rc == 6
    assert "exists" in err and "--force" in err
    # --force replaces run directories only, never a folder of someone else's files
    rc, _, err = run_cli(capsys, "capture", *SMALL, "--variants", "index_put", "--out", str(tmp_path),
                         "--run-id", "taken", "--force")
    assert rc == 6 and "not a kvprof run directory" in err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_force_replaces_a_run_directory_whole(tmp_path, capsys):
    args = ["capture", *SMALL, "--phase", "decode", "--batch-sizes", "1", "--out", str(tmp_path), "--run-id", "r",
            "--no-summary"]
    assert run_cli(capsys, *args, "--variants", "index_put").rc == 0
    (tmp_path / "r" / "stale.txt").write_text("from the old run")
    assert run_cli(capsys, *args, "--variants", "two_stream", "--force").rc == 0
    manifest = orjson.loads((tmp_path / "r" / "manifest.json").read_bytes())
    assert [v for v, e in manifest["variants"].items() if e["available"]] == ["two_stream"]
    assert not (tmp_path / "r" / "stale.txt").exists() and not (tmp_path / "r" / "index_put.pt.trace.json.gz").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temporary or old folder left


def test_ctrl_c_leaves_no_run_dir(tmp_path):
    proc = kvprof_child("capture", "--model", "llama-3.1-70b", "--steps", "400", "--variants", "index_put",
                        "--no-progress", "--out", str(tmp_path), "--run-id", "interrupted",
                        env={"PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not any(tmp_path.iterdir()):
            time.sleep(0.2)  # wait until the temp run dir exists: capture is under way
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        end(proc)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"interrupted" in err and b"Traceback" not in err
    assert list(tmp_path.iterdir()) == []


BLOCKING_WRITER = (
    "import os, pathlib\n"
    "from kvprof.kvcache.writers.index_put import IndexPutWriter\n"
    "class Blocking(IndexPutWriter):\n"
    "    name = 'blocking'\n"
    "    def write(self, *args, **kwargs):\n"
    "        pathlib.Path(os.environ['READY_FILE']).touch()\n"  # tell the test we are inside exec() now
    "        exec('while True: pass')\n"  # where dataclasses and torch's codegen run code
    "def make():\n    return Blocking()\n"
)


def _interrupt_inside_exec(tmp_path: Path, *command: str) -> tuple[int, bytes]:
    plugin = tmp_path / "plug"
    plugin.mkdir()
    (plugin / "blocking_writer.py").write_text(BLOCKING_WRITER)
    (plugin / "control.py").write_text(  # the same interrupt, caught by plain code
        "import blocking_writer\n"
        "try:\n    blocking_writer.make().write_unchecked()\n"  # its own code, without the contract's checks
        "except KeyboardInterrupt:\n    raise SystemExit(130)\n")
    ready = tmp_path / "ready"
    env = {**os.environ, "READY_FILE": str(ready),
           "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not ready.exists() and proc.poll() is None:
            time.sleep(0.05)
        if not ready.exists():
            proc.kill()
        assert ready.exists(), proc.communicate(timeout=60)[1].decode()[-2000:]
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err
    finally:
        end(proc)  # a lost SIGINT would leave it spinning


def test_ctrl_c_inside_exec_still_exits_130(tmp_path):
    """CPython kills a ``python -m`` process by SIGINT at exit if a KeyboardInterrupt ever left an
    ``exec()`` of a string, caught or not; CI once saw -2 here. kvprof raises its own subclass."""
    out = tmp_path / "out"
    rc, err = _interrupt_inside_exec(
        tmp_path, "kvprof", "capture", "--model", "llama-3.1-70b", "--steps", "2", "--warmup", "0",
        "--variants", "index_put", "--writer", "blocking_writer:make", "--no-progress", "--out", str(out),
        "--run-id", "r", "--no-summary")
    assert rc == 130, err.decode()[-2000:]
    assert err.decode().strip().splitlines()[-1] == "kvprof capture: interrupted; nothing half-written was kept"
    assert b"Traceback" not in err
    assert not out.exists() or list(out.iterdir()) == []


def test_plain_keyboard_interrupt_inside_exec_dies_by_signal(tmp_path):
    """The control: the same interrupt, caught by plain code under ``python -m``, ends it by SIGINT."""
    rc, _ = _interrupt_inside_exec(tmp_path, "control")
    if rc == 130:
        pytest.skip("this CPython does not exit by signal after a caught KeyboardInterrupt in exec()")
    assert rc == -signal.SIGINT


def test_third_party_writer_by_spec(tmp_path, monkeypatch, capsys):
    plugin = tmp_path / "plug"
    plugin.mkdir()
    (plugin / "my_writer.py").write_text(
        "from kvprof.kvcache.writers.index_put import IndexPutWriter\n"
        "class Mine(IndexPutWriter):\n    name = 'mine'\n"
        "def make():\n    return Mine()\n"
    )
    monkeypatch.syspath_prepend(str(plugin))
    rc, _, _ = run_cli(capsys, "capture", *SMALL, "--variants", "index_put", "--writer", "my_writer:make",
                       "--out", str(tmp_path / "o"), "--run-id", "r", "--no-summary")
    assert rc == 0
    manifest = orjson.loads((tmp_path / "o" / "r" / "manifest.json").read_bytes())
    assert manifest["variants"]["mine"]["files"]["torch_trace"] == "mine.pt.trace.json.gz"


def test_triton_interpreter_is_set_only_on_a_cpu_and_only_when_unset(monkeypatch):
    """kvprof sets TRITON_INTERPRET=1 for a CPU capture when nothing set it and no Triton
    kernel module is imported yet; an explicit value (0 too) is the user's."""
    import torch

    from kvprof.capture import runtime
    from kvprof.kvcache import devinfo

    monkeypatch.setattr(devinfo, "TRITON_WRITER_MODULES", set())  # no Triton writer imported yet
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert runtime.triton_interpreter(torch.device("cuda")) is None and "TRITON_INTERPRET" not in os.environ
    assert runtime.triton_interpreter(torch.device("cpu")) == "set by kvprof"
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert runtime.triton_interpreter(torch.device("cpu")) == "from the environment"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert runtime.triton_interpreter(torch.device("cpu")) is None and os.environ["TRITON_INTERPRET"] == "0"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setitem(sys.modules, "kvprof.kvcache.writers.triton_kernel", object())  # imported before: too late
    devinfo.decorates_triton_kernels("kvprof.kvcache.writers.triton_kernel")
    assert runtime.triton_interpreter(torch.device("cpu")) is None and "TRITON_INTERPRET" not in os.environ


def test_every_triton_writer_module_says_so_when_imported():
    """A writer module that decorates Triton kernels registers itself with kvprof.kvcache.devinfo
    as it is imported (devinfo sits below the writers and names none of them), so that
    triton_interpreter knows when it is too late to set TRITON_INTERPRET."""
    import ast
    import importlib

    from kvprof.kvcache import devinfo

    trees = {f"kvprof.kvcache.writers.{p.stem}": ast.parse(p.read_text())
             for p in (Path(devinfo.__file__).parent / "writers").glob("*.py")}
    decorating = sorted(m for m, tree in trees.items() if any(
        isinstance(n, ast.FunctionDef) and any(ast.unparse(d).startswith("triton.jit") for d in n.decorator_list)
        for n in ast.walk(tree)))
    registering = sorted(m for m, tree in trees.items() if any(
        isinstance(n, ast.Call) and getattr(n.func, "id", None) == "decorates_triton_kernels" for n in ast.walk(tree)))
    assert decorating and registering == decorating
    importlib.import_module("kvprof.kvcache.writers.triton_kernel")
    assert {"kvprof.kvcache.writers.triton_convert", "kvprof.kvcache.writers.triton_kernel"} <= \
        devinfo.TRITON_WRITER_MODULES


def test_capture_restores_torch_threads(tmp_path):
    import torch

    from kvprof import api
    from kvprof.capture.config import CaptureConfig

    before = torch.get_num_threads()
    config = CaptureConfig(variants=["index_put"], phases=["decode"], decode_sizes=[1], steps=1, warmup=0,
                           device="cpu", output=str(tmp_path), run_id="t")
    result = api.capture(config, analyse=False)
    assert torch.get_num_threads() == before
    assert result.manifest.config["threads"] == 1 and result.manifest.config["layers"] == CPU_DEFAULT_LAYERS


def test_checking_and_resolving_a_config_make_new_ones(monkeypatch):
    """validate, resolved_for, with_run_id and the capture's prepare never change the config they
    are given: a frozen CaptureConfig in, a new resolved one out."""
    import dataclasses

    from kvprof.capture.config import CaptureConfig
    from kvprof.capture.runtime import prepare
    from kvprof.kvcache.layouts.layout import get_layout

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    config = CaptureConfig(model="deepseek-v2-lite", phases=["decode"], decode_sizes=[1], device="cpu")
    given = dataclasses.replace(config)
    resolved = config.validate().resolved_for("cpu").with_run_id()
    prepared, runtime = prepare(config)
    assert config == given and config.layers is None and config.threads is None and config.run_id is None
    assert resolved.variants == prepared.variants == list(get_layout("mla").capture_defaults)
    assert resolved.layers == prepared.layers == CPU_DEFAULT_LAYERS and resolved.threads == prepared.threads == 1
    assert resolved.run_id and runtime.device.type == "cpu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.layers = 3  # type: ignore[misc]


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("capture", "analyze", "compare", "bench", "scrub", "variants"):
        assert cmd in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2


def test_child_counts_only_measured_writes(tmp_path):
    """The nsys pass's child reports the same paths the torch pass does for one config."""
    from kvprof.capture.child import run_child
    from kvprof.capture.config import CaptureConfig

    config = CaptureConfig(decode_sizes=[2], prefill_sizes=[8], steps=2, warmup=2, device="cpu")
    spec = tmp_path / "spec.json"
    spec.write_bytes(orjson.dumps({"config": config.as_dict(), "variant": "two_stream"}))
    assert run_child(spec, tmp_path / "result.json") == 0
    result = orjson.loads((tmp_path / "result.json").read_bytes())
    # CPU_DEFAULT_LAYERS layers x (decode + prefill) x 2 steps
    assert result["paths"] == {"two_copies": CPU_DEFAULT_LAYERS * 2 * 2}


def test_planted_secret_reaches_no_byte_of_a_cpu_run(tmp_path, monkeypatch, capsys):
    """The CPU half of the environment check (the H200 samples are checked in test_samples.py)."""
    secret = "kvprof-planted-cpu-5e0c1a9f77"
    monkeypatch.setenv("KVPROF_TEST_SECRET", secret)
    monkeypatch.setenv("HF_TOKEN", "hf_" + secret)
    rc, _, _ = run_cli(capsys, "capture", *SMALL, "--variants", "index_put,two_stream", "--out", str(tmp_path),
                       "--run-id", "s")
    assert rc == 0
    files = [p for p in (tmp_path / "s").rglob("*") if p.is_file()]
    assert len(files) >= 6
    for p in files:
        data = p.read_bytes()
        if p.suffix == ".gz":
            data = gzip.decompress(data)
        assert secret.encode() not in data, p


def test_kineto_start_stop_markers_are_left_out_of_stderr_and_nothing_else(capfd):
    """What torch >= 2.13's Kineto writes to fd 2 at each profiler start and stop is dropped; its
    other lines and Python's own stderr pass through."""
    import sys as _sys

    from kvprof.capture.torch_pass import _without_kineto_markers

    with _without_kineto_markers():
        os.write(2, b"USDT:2026-12-04 01:48:05 10413:10413 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"STAGE:2026-12-04 01:48:05 10413:10413 SyncActivityProfilerHandler.cpp:60] Completed Stage\n")
        print("a Python warning", file=_sys.stderr)
        os.write(2, b"USDT:2026-12-04 01:48:06 10413:10413 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
        os.write(2, b"USDT: something else Kineto says\n")
    err = capfd.readouterr().err
    assert sorted(err.splitlines()) == [  # (pytest captures sys.stderr apart from fd 2: no order across them)
        "STAGE:2026-12-04 01:48:05 10413:10413 SyncActivityProfilerHandler.cpp:60] Completed Stage",
        "USDT: something else Kineto says", "a Python warning"]
