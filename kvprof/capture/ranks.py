"""``capture --ranks N``: one process per tensor-parallel rank, one run folder for all of them.

Each rank is ``python -m kvprof.capture.rank_worker`` in its own process group: NCCL with
one GPU per rank when CUDA is there, Gloo on CPU. The ranks write into the run's
temporary folder; only when every rank has succeeded does the launcher write the
manifest (``world_size``, ``backend``, ``ranks``) and rename the folder into place. A rank
that fails stops the others (their process groups are killed) and the folder is
removed: the error names the rank and its one-line reason. ``NCCL_NVLS_ENABLE`` reaches
every rank (0 unless set): NVLink multicast stays off.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import torch

from kvprof.capture.plan import (
    CapturedRun,
    CapturePlan,
    base_manifest,
    plan_variants,
    scrub_files,
    scrub_manifest,
    sweep_stale,
    variant_entry,
)
from kvprof.capture.runtime import Runtime
from kvprof.core.atomic import atomic_directory, atomic_write_bytes
from kvprof.core.errors import DeviceError, KvprofError, Setting, UsageError, Words, decoded
from kvprof.core.ranks import RankEntry
from kvprof.core.run import Manifest, PathReport, VariantEntry
from kvprof.core.rundir import RunDir
from kvprof.kvcache.guards import check_capture

POLL_S = 0.1
GRACE_S = 3.0  # how long the launcher waits for the other ranks' records once one has failed


class RankFailed(KvprofError):
    """A rank exited with an error; the exit code is the rank's own."""


def backend_for(plan: CapturePlan) -> tuple[str, torch.device]:
    """NCCL on CUDA (one GPU per rank, which must exist), Gloo on CPU."""
    device = plan.device
    n = int(plan.ranks or 1)
    if device.type == "cuda":
        if device.index not in (None, 0):
            raise UsageError(Setting("ranks"), " puts rank r on cuda:r; pass ", Setting("device"),
                             " cuda (or auto), not a single GPU")
        have = torch.cuda.device_count()
        if n > have:
            raise DeviceError(Setting("ranks"), f" {n} needs {n} GPUs (one per rank); this machine has {have}")
        return "nccl", torch.device("cuda", 0)
    if device.type != "cpu":
        raise UsageError(Setting("ranks"), f" runs on CUDA (NCCL) or CPU (Gloo), not on {device.type}")
    return "gloo", device


def rank_environment(rank: int, world: int) -> dict[str, str]:
    """The parent's environment plus the rank's identity; NVLink multicast off unless set."""
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    return env


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill every rank still running (its whole process group) and reap it."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait for cooperation
            pass


def _record(tmp: Path, rank: int) -> tuple[float, int, str] | None:
    """A rank's error record: (when it failed, exit code, one-line reason), or None."""
    try:
        code, when, line = RunDir(tmp).rank_error(rank).read_text().strip().split("\t", 2)
        return float(when), int(code), line
    except (OSError, ValueError):
        return None


def _failure(tmp: Path, rank: int, code: int) -> RankFailed:
    record = _record(tmp, rank)
    line: object
    if record is not None:
        _, exit_code, text = record
        line = decoded(text)  # the settings it names, as the caller will spell them
    else:  # no record (killed, or failed before it could write one): the last line of its log
        exit_code, line = code, f"exited with status {code}"
        try:
            tail = [x for x in RunDir(tmp).rank_log(rank).read_text(errors="replace").splitlines() if x.strip()]
            if tail:
                line = f"{line}: {tail[-1].strip()[:300]}"
        except OSError:
            pass
    err = RankFailed(f"rank {rank} failed: ", line, "; no run was kept")
    err.exit_code = exit_code if 0 < exit_code < 128 else 1
    return err


def first_failure(tmp: Path, procs: list[subprocess.Popen[bytes]], grace_s: float = GRACE_S) -> RankFailed:
    """The rank that failed first, not the first one seen exiting.

    When one rank raises, its peers fail soon after in a collective ("connection closed by
    peer"), and either may exit first. Each rank records when it failed, so the launcher
    waits up to ``grace_s`` for the others to exit and names the earliest record."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    records = {r: rec for r in range(len(procs)) if (rec := _record(tmp, r)) is not None}
    if records:
        rank = min(records, key=lambda r: records[r][0])
    else:
        rank = next(r for r, p in enumerate(procs) if p.poll() not in (None, 0))
    return _failure(tmp, rank, int(procs[rank].poll() or 1))


def launch(tmp: Path, world: int, backend: str, log: Callable[[str], None], read_events: str = "") -> None:
    """Start every rank, wait for all; a failure stops the rest and the first one is raised.
    ``read_events``: the ``module:function`` each rank reads its step templates' traces with."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(world):
            fh = open(RunDir(tmp).rank_log(rank), "wb")  # noqa: SIM115 - closed below
            logs.append(fh)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "kvprof.capture.rank_worker", str(tmp), str(rank), str(world), backend,
                 read_events],
                env=rank_environment(rank, world), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True))
        log(f"started {world} rank(s) ({backend})")
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                raise first_failure(tmp, procs)
            if all(c == 0 for c in codes):
                return
            time.sleep(POLL_S)
    finally:
        _stop(procs)
        for fh in logs:
            fh.close()


def merge_manifest(plan: CapturePlan, tmp: Path, world: int, backend: str, device: torch.device,
                   runtime: Runtime | None = None, names: Callable[[str], str] = str) -> Manifest:
    """Rank 0's entries as the variants (any reader opens the run), every rank under ``ranks``."""
    manifest = base_manifest(plan, device, runtime)
    # each rank sets the resolved count itself; None: every rank keeps torch's own choice
    manifest.config["threads"] = plan.threads
    for p in plan_variants(plan, device):
        manifest.variants[p.name] = variant_entry(p, names)
    manifest.world_size, manifest.backend = world, backend
    docs = [orjson.loads(RunDir(tmp).rank_result(r).read_bytes()) for r in range(world)]
    manifest.device = docs[0]["device"]
    for doc in docs:
        entry = RankEntry(rank=int(doc["rank"]), device=doc["device"], timings=doc["timings"])
        for name, v in doc["variants"].items():
            entry.files[name] = v["torch_trace"]
            entry.paths[name] = dict(v["paths"])
        manifest.ranks.append(entry)
    for name, v in docs[0]["variants"].items():
        e: VariantEntry = manifest.variants[name]
        e.files["torch_trace"] = v["torch_trace"]
        e.paths, e.kernels_per_write, e.bytes_per_token = dict(v["paths"]), dict(v["kernels_per_write"]), \
            v["bytes_per_token"]
        e.fused = PathReport.from_json(v["fused"])
    manifest.files = {RunDir.TIMINGS_KEY: docs[0]["timings"]}
    return manifest


def capture_ranks(plan: CapturePlan, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                  runtime: Runtime | None = None, *, names: Callable[[str], str] = str,
                  read_events: str = "") -> CapturedRun:
    """The multi-rank capture; same result as the one-process ``capture``. ``runtime``: what
    ``kvprof.capture.runtime.start`` set up (each rank sets the same threads itself);
    ``read_events``: the ``module:function`` the ranks read their step templates' traces with."""
    backend, device = backend_for(plan)
    world = int(plan.ranks or 1)
    for p in plan_variants(plan, device):
        if p.reason is not None:
            log(Words(f"skipping {p.name}: ", p.reason))
    check_capture(plan, device)  # one rank's sizes and memory
    final = plan.final
    problems: list[KvprofError] = []
    sweep_stale(final.parent, log)
    with atomic_directory(final) as tmp:
        tmp = Path(tmp)
        atomic_write_bytes(RunDir(tmp).ranks_config, orjson.dumps(dict(plan.settings)))
        launch(tmp, world, backend, log, read_events)
        manifest = merge_manifest(plan, tmp, world, backend, device, runtime, names)
        for f in list(tmp.iterdir()):  # the launcher's own files: not part of the run
            if RunDir.is_launcher_file(f.name):
                f.unlink()
        if plan.scrub:
            manifest.scrubbed = scrub_files(tmp)
        manifest = scrub_manifest(manifest) if plan.scrub else manifest
        RunDir(tmp).write_manifest(manifest)
    return CapturedRun(final, manifest, problems)


__all__ = ["RankFailed", "backend_for", "capture_ranks", "launch", "rank_environment"]
