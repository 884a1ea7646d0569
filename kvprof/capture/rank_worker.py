"""One rank of ``capture --ranks N``: ``python -m kvprof.capture.rank_worker RUN_TMP RANK WORLD BACKEND``.

Joins the process group through a file store in the run's temporary folder, runs every
runnable variant as the one-process capture does -- with the all-reduces a
tensor-parallel layer has around the write -- and writes its traces (named by rank,
``distributedInfo`` set) and ``.rank<r>.json`` (what the launcher puts in the manifest).
Any failure ends as one line in ``.rank<r>.error`` and a non-zero exit; the launcher
then stops the other ranks and removes the whole folder.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import torch
import torch.distributed as dist

from kvprof.capture.plan import CapturePlan, resolve_settings
from kvprof.capture.session import MHASession
from kvprof.capture.torch_pass import EventReader
from kvprof.core.atomic import atomic_write_bytes
from kvprof.core.errors import KvprofError, encoded
from kvprof.core.run import PathReport, TraceMeta
from kvprof.core.rundir import RunDir
from kvprof.core.timings import StepTimings
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.layer import DecoderContext

TIMEOUT = timedelta(minutes=10)  # a rank stuck in a collective: the launcher also stops the rest when one fails


class RankSession(MHASession):
    """A variant's session on one rank: each layer's write followed by the two all-reduces of a
    TP layer (attention output, MLP output). Without ``--context layer`` they reduce a
    stand-in of the hidden size (zeros, so repeated sums stay finite)."""

    def __init__(self, plan: CapturePlan, writer: Writer, device: torch.device, *,
                 context: DecoderContext | None = None) -> None:
        super().__init__(plan, writer, device, context=context)
        self.hidden = self.shape.hidden or self.shape.head_num * self.shape.head_dim * self.shape.tp
        self._stand_in: dict[int, torch.Tensor] = {}

    def _reduce(self, t: torch.Tensor) -> None:
        dist.all_reduce(t)

    def _hidden_buffer(self, tokens: int) -> torch.Tensor:
        buf = self._stand_in.get(tokens)
        if buf is None:  # first made in the eager warm-up, so graph capture allocates nothing
            buf = self._stand_in[tokens] = torch.zeros(tokens, self.hidden, dtype=self.input_dtype, device=self.device)
        return buf

    def write_step(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        out = self._hidden_buffer(loc.shape[0])
        for layer in self.layers:
            self.pool.set_kv_buffer(layer, loc, k, v, self.k_scale, self.v_scale)
            self._reduce(out)  # after attention's output projection
            self._reduce(out)  # after the MLP

    def step(self, prepared: Any, loc: torch.Tensor, mode: str | None = None) -> None:
        mode = mode or self.mode
        if mode == "writes":
            self.write_step(loc, prepared.k, prepared.v)
            return
        self.layer_step(prepared, loc, mode, reduce=self._reduce)

    def close(self) -> None:
        self._stand_in.clear()
        super().close()


def run_rank(plan: CapturePlan, out: Path, rank: int, world: int, device: torch.device,
             read_events: EventReader) -> dict[str, Any]:
    """Every runnable variant on this rank; returns this rank's part of the manifest."""
    from kvprof.capture.plan import make_context, plan_variants, trace_extra, variant_entry
    from kvprof.capture.torch_pass import run_torch_pass
    from kvprof.kvcache.devinfo import device_properties
    from kvprof.kvcache.dtypes import short_name

    planned = plan_variants(plan, device)
    context = make_context(plan, device)
    props = device_properties(device)
    timings = StepTimings(context=plan.context, context_len=plan.context_len if context else None)
    variants: dict[str, Any] = {}
    for p in planned:
        if p.reason is not None:
            continue
        info = p.writer.info()
        meta = TraceMeta(variant=p.name, fused=info.fused, run_id=plan.run_id, layout=plan.layout,
                         cache_dtype=short_name(plan.cache_dtype),
                         input_dtype=short_name(plan.input_dtype), device=props,
                         model=plan.shape.as_dict(),
                         extra={"rank": rank, "world_size": world, **trace_extra(variant_entry(p))})
        session = RankSession(plan, p.writer, device, context=context)
        try:
            res = run_torch_pass(session, out, meta, read_events=read_events, sync_events=plan.torch_sync_events,
                                 rank=rank, world_size=world, name=RunDir.torch_trace_name(p.name, rank))
        finally:
            session.close()
        for rec in res.step_timings:
            timings.add(rec)
        variants[p.name] = {
            "torch_trace": res.torch_trace, "paths": dict(res.meta.paths),
            "kernels_per_write": dict(res.meta.kernels_per_write), "bytes_per_token": res.meta.bytes_per_token,
            "fused": PathReport.of_paths(info.fused, dict(res.meta.paths)).to_json(),
        }
    name = RunDir(out).write_timings(timings, RunDir.rank_timings_name(rank))
    return {"rank": rank, "device": props, "variants": variants, "timings": name}


def record_failure(out: Path, rank: int, exc: BaseException) -> int:
    """Write the rank's one-line reason with the time it failed; return its exit code.

    Written before the process group is torn down: the rank that fails first must have the
    earliest record, not the peers that only see its connection close afterwards."""
    code = exc.exit_code if isinstance(exc, KvprofError) else 1
    line = " ".join(encoded(exc).split())[:500] if isinstance(exc, KvprofError) \
        else " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    path = RunDir(out).rank_error(rank)
    if not path.exists():  # the first record stands: a later teardown error is a consequence
        try:
            path.write_text(f"{code}\t{time.time():.6f}\t{line}\n")
        except OSError:
            pass
    return code if isinstance(code, int) and 0 < code < 128 else 1


def _reader(spec: str) -> EventReader:
    """The launcher's ``module:function`` for reading a step template's trace (a layer above
    capture provides it; the name comes in as data)."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        def unread(path: Path) -> Any:
            raise KvprofError(f"no trace reader was given to this rank to read {path.name}")

        return unread
    fn: EventReader = getattr(importlib.import_module(module), name)
    return fn


def main(argv: list[str]) -> int:
    out, rank, world, backend = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    try:
        if backend == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        # the launcher's plan again, on this rank's device
        plan = resolve_settings(orjson.loads(RunDir(out).ranks_config.read_bytes()), device)
        if plan.threads is not None:  # resolved by the launcher
            torch.set_num_threads(plan.threads)
        read_events = _reader(argv[4] if len(argv) > 4 else "")
        # a FileStore by absolute path, not a file:// URL: in "file://traces/x" the first folder of
        # a relative --out is read as a host and every rank waited for the others until TIMEOUT
        store = dist.FileStore(str(RunDir(out).ranks_store.resolve()), world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT)
        try:
            doc = run_rank(plan, out, rank, world, device, read_events)
            dist.barrier()  # every rank finished its traces before any reports success
        except BaseException as exc:
            record_failure(out, rank, exc)
            raise
        finally:
            dist.destroy_process_group()
        atomic_write_bytes(RunDir(out).rank_result(rank), orjson.dumps(doc))
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the one line the launcher shows
        return record_failure(out, rank, exc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
