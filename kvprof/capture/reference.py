"""The reference pass: each variant's steps with no profiler and no ranges, timed.

Every capture runs it, whatever ``--profiler`` says: a plain (uninstrumented) pool, the
same phases, slots and graphs as the profiled passes, and a ``StepTimer`` around each
step (CUDA events: the GPU timeline a step pays, launch gaps inside the step included;
wall clock on CPU). Modes are interleaved in rounds so that a drift in clocks or temperature moves
them alike. With a decoder context it also times the same layers without the write
(the rest of the step) and the writes alone (the projection's per-write input).

On a CPU the modes alternate step by step, in an order drawn afresh each step (seeded by the
capture's seed): a process sharing a core gets time slices of about one fixed length, so
with a fixed order it is preempted at the same point of every round and one mode can take
every preemption while another takes none. A ``control`` series is timed between them: the
step's K and V stored at the step's slots of a scratch tensor, once per layer, by torch's
own index_put (the same bytes and memory pattern, none of kvprof's pool or writer code), and
a second, ``control_numpy``, the same bytes at the same slots stored by numpy (no torch at
all: a torch that became slower slows the first control with the index_put variant, never
this one). A shared machine runs one process slower than another for its whole life, or for
a stretch of steps; the controls slow with it, so the regression gate can tell a slower
machine from slower code (kvprof.analysis.gate; docs/formats.md has what was measured).

Where the plan allows more steps than it asks for (a CPU capture left to its defaults), a
point's pass goes on past ``reference_steps``, round by round, while its timed steps have
taken less than CPU_REFERENCE_BUDGET_S, up to ``reference_steps_up_to``: every mode of the
point gets the same count, cheap points many steps, slow ones the first few."""

from __future__ import annotations

import random
import time

import numpy as np
import torch

from kvprof.capture.defaults import CPU_REFERENCE_BUDGET_S
from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import CapturePlan
from kvprof.capture.session import PreparedPhase, StepTimer
from kvprof.core.timings import CONTROL, FREE_CONTROL, StepSamples
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.layer import DecoderContext

ROUND = 10  # steps of one mode before the next mode's turn
WARM_REPLAYS = 3
# A replayed step is GPU-bound and its host submission (event, slot copy, replay, event)
# takes tens of µs: should the GPU drain its queue, a step's events would time the wait
# for the host. Before each round of replays the stream sleeps long enough for the host
# to queue the whole round, so the events time the GPU timeline alone, as in an engine
# whose host runs ahead. Eager steps are host-bound and timed as they come.
HEAD_START_CYCLES = 2_000_000  # about 1 ms at the H200's 1.98 GHz


def reference_modes(context: DecoderContext | None) -> list[str]:
    return ["layer", "layer_no_write", "writes"] if context is not None else ["writes"]


class ControlStep:
    """The machine's speed at each step, without kvprof: step i's K and V stored at step i's slots
    of scratch tensors, once per layer the step writes, by torch's index_put (the bytes, the
    random rows and the count of calls a write makes; no pool, no writer, no conversion)."""

    def __init__(self, prepared: PreparedPhase, layers: int) -> None:
        self.prepared, self.layers = prepared, layers
        rows = int(prepared.locs.max()) + 1 if prepared.locs.numel() else 1
        k, v = prepared.k, prepared.v
        # zeroed, as the pools are: every page is touched before the first timed step
        self.k_out = torch.zeros((rows, *k.shape[1:]), dtype=k.dtype, device=k.device)
        self.v_out = torch.zeros((rows, *v.shape[1:]), dtype=v.dtype, device=v.device)

    def step(self, i: int) -> None:
        p = self.prepared
        loc = p.locs[i % p.spec.steps]
        for _ in range(self.layers):
            self.k_out[loc] = p.k
            self.v_out[loc] = p.v


class FreeControlStep:
    """The machine's speed at each step, without torch: the ControlStep's stores done by numpy on
    the K and V bytes (copied out once, before any timed step), so that no code a variant runs
    -- torch's dispatcher and index kernels included -- is in it."""

    def __init__(self, prepared: PreparedPhase, layers: int) -> None:
        self.layers, self.steps = layers, prepared.spec.steps
        self.locs = prepared.locs.cpu().numpy().astype(np.int64)
        self.k, self.v = (_rows(x) for x in (prepared.k, prepared.v))
        rows = int(self.locs.max()) + 1 if self.locs.size else 1
        # written with zeros, as torch.zeros does (np.zeros maps pages on first touch: a page fault
        # inside the timed steps)
        self.k_out, self.v_out = (np.empty((rows, *x.shape[1:]), dtype=x.dtype) for x in (self.k, self.v))
        for out in (self.k_out, self.v_out):
            out.view(np.uint8).fill(0)

    def step(self, i: int) -> None:
        loc = self.locs[i % self.steps]
        for _ in range(self.layers):
            self.k_out[loc] = self.k
            self.v_out[loc] = self.v


def _rows(x: torch.Tensor) -> np.ndarray:
    """A copy of x's bytes as numpy, one opaque item per token's row (numpy copies each row at
    once, as torch's index_put does, not byte by byte)."""
    raw = x.detach().contiguous().cpu().reshape(x.shape[0], -1).view(torch.uint8).numpy().copy()
    return raw.view(np.dtype((np.void, raw.shape[1]))) if raw.shape[1] else raw


def run_reference_pass(plan: CapturePlan, writer: Writer, device: torch.device,
                       context: DecoderContext | None = None) -> list[StepSamples]:
    """Timed steps per (phase, size, mode) for one writer; raises what the workload raises."""
    out: list[StepSamples] = []
    modes = reference_modes(context)
    cpu = device.type == "cpu"
    timed = [*modes, CONTROL, FREE_CONTROL] if cpu else modes
    per_round = 1 if cpu else ROUND  # a CPU's speed changes within a series: alternate every step
    n, up_to = plan.reference_steps, max(plan.reference_steps, plan.reference_steps_up_to)
    with session_for(plan, writer, device, instrument=False, context=context) as session:
        for index, spec in enumerate(session.phases):
            prepared: PreparedPhase = session.prepare(spec, index)
            control = ControlStep(prepared, len(session.layers)) if cpu else None
            free = FreeControlStep(prepared, len(session.layers)) if cpu else None
            for mode in modes:
                session.warm_up(prepared, mode)
                if spec.graph:
                    session.capture_graph(prepared, mode)
                for i in range(WARM_REPLAYS):
                    session.run_step(prepared, i, mode)
            if control is not None and free is not None:
                for i in range(WARM_REPLAYS):
                    control.step(i)
                    free.step(i)
            session.synchronize()
            timers = {mode: StepTimer(device, up_to) for mode in timed}
            done = 0
            order = random.Random(plan.seed * 1_000_003 + index)
            started = time.perf_counter()
            # the steps asked for, then (where the plan allows more) on while within the budget
            while done < n or (done < up_to and time.perf_counter() - started < CPU_REFERENCE_BUDGET_S):
                count = min(per_round, (n if done < n else up_to) - done)
                this_round = list(timed)
                if cpu:
                    order.shuffle(this_round)
                for mode in this_round:
                    timer = timers[mode]
                    if spec.graph and device.type == "cuda":
                        torch.cuda._sleep(HEAD_START_CYCLES)
                    for i in range(done, done + count):
                        timer.start()
                        if control is not None and mode == CONTROL:
                            control.step(i)
                        elif free is not None and mode == FREE_CONTROL:
                            free.step(i)
                        else:
                            session.run_step(prepared, i, mode)
                        timer.stop()
                done += count
            session.synchronize()
            for mode in timed:
                out.append(StepSamples(
                    variant=writer.name, pass_="reference", phase=spec.phase, size=spec.size, mode=mode,
                    graph=spec.graph, writes_per_step=0 if mode == "layer_no_write" else len(session.layers),
                    clock=timers[mode].clock, samples_ns=tuple(timers[mode].samples_ns()),
                ))
            del prepared, control, free
    return out


__all__ = ["ControlStep", "FreeControlStep", "reference_modes", "run_reference_pass"]
