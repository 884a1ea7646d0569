"""``capture --ranks N`` on CPU with Gloo: one run folder, per-rank traces HTA reads as ranks,
the analysis per rank with skew and collective wait; a failing rank leaves nothing behind."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

from cli_support import end_group
from kvprof.capture.defaults import CPU_DEFAULT_LAYERS
from kvprof.cli import main

TINY = ["--model", "llama-3.1-8b", "--tp", "8", "--phase", "decode", "--batch-sizes", "2", "--steps", "3",
        "--warmup", "1", "--device", "cpu", "--no-progress"]


@pytest.mark.slow  # two rank processes, each importing torch and capturing
def test_two_ranks_make_one_run_with_per_rank_traces_and_analysis(tmp_path, capsys):
    rc = main(["capture", *TINY, "--ranks", "2", "--variants", "index_put,two_stream", "--out", str(tmp_path),
               "--run-id", "r2"])
    out = capsys.readouterr().out
    assert rc == 0
    run = tmp_path / "r2"
    names = sorted(p.name for p in run.iterdir())
    assert not [n for n in names if n.startswith(".")], names  # the launcher's own files are gone
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    assert manifest["world_size"] == 2 and manifest["backend"] == "gloo"
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    for r in manifest["ranks"]:
        for variant in ("index_put", "two_stream"):
            name = r["files"][variant]
            assert name == f"{variant}.rank{r['rank']}.pt.trace.json.gz" and name in names
            with gzip.open(run / name) as fh:
                text = fh.read().decode()
            # HolisticTraceAnalysis finds the rank with this regex over the raw text
            assert int(re.search(r'"rank":\s+(\d+)', text).group(1)) == r["rank"]
            assert json.loads(text)["distributedInfo"]["world_size"] == 2
            assert sum(r["paths"][variant].values()) > 0
    assert manifest["variants"]["index_put"]["files"]["torch_trace"] == "index_put.rank0.pt.trace.json.gz"

    summary = orjson.loads((run / "summary.json").read_bytes())
    ranks = summary["ranks"]
    assert ranks["world_size"] == 2 and ranks["same_path"] == {"index_put": True, "two_stream": True}
    per = pd.DataFrame(ranks["per_rank"])
    assert sorted(set(per["rank"])) == [0, 1] and set(per["variant"]) == {"index_put", "two_stream"}
    # every layer's write on every measured step, per rank (on a CPU: the first CPU_DEFAULT_LAYERS layers)
    assert (per["writes"] == CPU_DEFAULT_LAYERS * 3).all()
    assert (per["write_ns"] > 0).all() and (per["step_ns"] > 0).all()
    # the two all-reduces per layer are found and take part of the step
    assert (per["collective_ns"] > 0).all() and (per["collective_ns"] < per["step_ns"]).all()
    assert (per["wait_ns"] >= 0).all()
    skew = pd.DataFrame(ranks["skew"])
    assert len(skew) == 2 and (skew["ranks"] == 2).all() and (skew["steps"] == 3).all()
    assert (skew["skew_median"] >= 1).all() and (skew["skew_max"] >= skew["skew_median"]).all()
    writes = pd.read_parquet(run / "writes.parquet")
    assert sorted(writes["rank"].unique()) == [0, 1]
    assert "python -m kvprof analyze" in out  # the capture's compact view; analyze has the rank tables
    assert main(["analyze", str(run), "--no-files"]) == 0
    out = capsys.readouterr().out
    assert "per rank, median (2 ranks" in out and "skew per step" in out
    # HolisticTraceAnalysis reads a variant's rank traces, alone in their folder, as its ranks
    folder = run / "hta" / "index_put"
    assert sorted(p.name for p in folder.iterdir()) == [f"index_put.rank{r}.pt.trace.json.gz" for r in (0, 1)]
    if importlib.util.find_spec("hta") is not None:  # the extra `hta`, installed in CI
        from hta.trace_analysis import TraceAnalysis

        assert sorted(TraceAnalysis(trace_dir=str(folder)).t.get_all_traces()) == [0, 1]


@pytest.mark.slow  # a launcher and two rank processes
def test_a_failing_rank_leaves_no_run_and_one_line(tmp_path):
    plugin = tmp_path / "plug"
    plugin.mkdir()
    (plugin / "rank_fail_writer.py").write_text(
        "import torch.distributed as dist\n"
        "from kvprof.kvcache.writers.index_put import IndexPutWriter\n"
        "class FailsOnRank1(IndexPutWriter):\n"
        "    name = 'fails_on_rank1'\n"
        "    def write(self, *a, **k):\n"
        "        if dist.is_initialized() and dist.get_rank() == 1:\n"
        "            raise RuntimeError('rank one cannot write')\n"
        "        return super().write(*a, **k)\n"
        "def make():\n    return FailsOnRank1()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvprof", "capture", *TINY, "--ranks", "2", "--variants", "index_put",
         "--writer", "rank_fail_writer:make", "--out", str(tmp_path / "out"), "--run-id", "bad"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=300)
    finally:
        end_group(proc)
    lines = err.decode().strip().splitlines()
    assert proc.returncode != 0
    assert lines[-1].startswith("kvprof capture: error: rank 1 failed: RuntimeError: rank one cannot write")
    assert "Traceback" not in err.decode()
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []  # no run, no temporary folder left


def test_the_rank_that_failed_first_is_named_not_the_first_seen_exiting(tmp_path):
    """Rank 0 exits first with the peer's closed connection; rank 1's earlier record is the cause."""
    from kvprof.capture.ranks import first_failure
    from kvprof.core.rundir import RunDir

    RunDir(tmp_path).rank_error(0).write_text("1\t200.5\tRuntimeError: Connection closed by peer\n")
    RunDir(tmp_path).rank_error(1).write_text("3\t200.1\tRuntimeError: rank one cannot write\n")
    procs = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({d}); raise SystemExit(1)"])
             for d in (0, 0.5)]
    try:
        procs[0].wait(timeout=60)
        err = first_failure(tmp_path, procs, grace_s=30)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert str(err) == "rank 1 failed: RuntimeError: rank one cannot write; no run was kept"
    assert err.exit_code == 3


@pytest.mark.parametrize(("args", "message"), [
    (["--ranks", "0"], "argument --ranks: expected a positive integer"),
    (["--ranks", "65"], "--ranks must be between 1 and 64"),
    (["--ranks", "2", "--profiler", "nsys"], "--ranks records torch.profiler traces only"),
])
def test_bad_ranks_are_refused(tmp_path, capsys, args, message):
    try:
        rc = main(["capture", *TINY, *args, "--out", str(tmp_path)])
    except SystemExit as exc:  # argparse's refusals exit from inside main
        rc = int(exc.code or 0)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and message in err[-1]
    assert list(tmp_path.iterdir()) == []


def test_the_environment_keeps_nvlink_multicast_off(monkeypatch):
    from kvprof.capture.ranks import rank_environment

    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    env = rank_environment(1, 4)
    assert (env["RANK"], env["WORLD_SIZE"], env["NCCL_NVLS_ENABLE"]) == ("1", "4", "0")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    assert rank_environment(0, 2)["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.gpu
def test_one_rank_on_one_gpu_through_nccl(tmp_path):
    """The NCCL path with --ranks 1: one GPU, graphs on, two_stream and the fused writer."""
    rc = main(["capture", "--model", "llama-3.1-70b", "--tp", "8", "--phase", "decode", "--batch-sizes", "1,64",
               "--steps", "5", "--ranks", "1", "--variants", "two_stream,triton_fused", "--no-progress",
               "--out", str(tmp_path), "--run-id", "g"])
    assert rc == 0
    run = tmp_path / "g"
    manifest = orjson.loads((run / "manifest.json").read_bytes())
    assert manifest["world_size"] == 1 and manifest["backend"] == "nccl"
    summary = orjson.loads((run / "summary.json").read_bytes())
    per = pd.DataFrame(summary["ranks"]["per_rank"])
    assert summary["ranks"]["step_source"] == "gpu"
    assert (per["writes"] > 0).all() and (per["write_ns"] > 0).all()
    # One rank has nothing to exchange: NCCL launches no kernel for its all-reduce, and graph
    # replays record no host call, so there is no collective time -- and none is made up.
    assert per["collective_ns"].isna().all()


def test_skew_is_slowest_over_median_rank_per_step():
    from kvprof.analysis.ranks import skew_table

    rows = [("v", "decode", 1, step, rank, ns) for step, times in enumerate([(100, 100, 150), (100, 120, 100)])
            for rank, ns in enumerate(times)]
    st = pd.DataFrame(rows, columns=["variant", "phase", "size", "step", "rank", "step_ns"])
    skew = skew_table(st).iloc[0]
    assert (skew["ranks"], skew["steps"]) == (3, 2)
    assert skew["skew_max"] == pytest.approx(1.5)
    assert skew["skew_median"] == pytest.approx((1.5 + 1.2) / 2)


def test_collective_time_counts_nested_host_calls_once():
    from kvprof.analysis.ranks import collective_per_step

    ev = pd.DataFrame({
        "name": ["c10d::allreduce_", "gloo:all_reduce", "c10d::allreduce_", "aten::index_put_"],
        "kind": ["cpu_op", "cpu_annotation", "cpu_op", "cpu_op"], "device": [-1] * 4,
        "start_ns": [0, 10, 100, 40], "dur_ns": [50, 20, 30, 5], "step": [0, 0, 0, 0],
        "variant": ["v"] * 4, "phase": ["decode"] * 4, "size": [1] * 4})
    out = collective_per_step(ev, rank=3)
    assert out[["rank", "collective_ns"]].values.tolist() == [[3, 80]]


def test_different_paths_across_ranks_are_flagged():
    from kvprof.analysis.ranks import rank_paths
    from kvprof.core.ranks import RankEntry

    entries = [RankEntry(0, paths={"f": {"fused": 8}}), RankEntry(1, paths={"f": {"fallback:dtype": 8}})]
    text, same = rank_paths(entries)
    assert same == {"f": False} and text[("f", 1)] == "fallback:dtype=8"


def test_manifest_ranks_round_trip_and_hostile_entries():
    from kvprof.core.ranks import RankEntry
    from kvprof.core.run import Manifest

    m = Manifest(run_id="r", world_size=2, backend="gloo",
                 ranks=[RankEntry(0, files={"v": "v.rank0.pt.trace.json.gz"}, paths={"v": {"fused": 4}})])
    back = Manifest.from_json(orjson.loads(m.dumps()))
    assert back.world_size == 2 and back.ranks[0].files == {"v": "v.rank0.pt.trace.json.gz"} and not back.warnings
    doc = orjson.loads(m.dumps())
    doc["ranks"] = [{"rank": -1}, {"rank": 1, "files": {"v": "../../etc/passwd"}, "paths": {"v": {"fused": "x"}}}, 5]
    hostile = Manifest.from_json(doc)
    assert [r.rank for r in hostile.ranks] == [1]
    assert hostile.ranks[0].files == {} and hostile.ranks[0].paths == {}
    assert len(hostile.warnings) >= 3


@pytest.mark.slow
def test_two_ranks_with_a_relative_out(tmp_path):
    """Each rank joined through ``file://{out}/...``: with a relative --out (the default, traces)
    the first folder was read as a host and every rank waited for the others for 10 minutes."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvprof", "capture", *TINY, "--steps", "1", "--warmup", "0", "--ranks", "2",
         "--variants", "index_put", "--no-summary", "--out", "rel/runs", "--run-id", "r"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # SIGTERM first: the launcher stops its ranks' process groups itself
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    manifest = orjson.loads((tmp_path / "rel" / "runs" / "r" / "manifest.json").read_bytes())
    assert manifest["world_size"] == 2 and [r["rank"] for r in manifest["ranks"]] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "rel" / "runs").iterdir()) == ["r"]
