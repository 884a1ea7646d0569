"""The engine-neutral half of kvprof's engine plugins: what every adapter shares.

An adapter (``kvprof.integrations.sglang``, ``kvprof.integrations.vllm``) finds the engine's KV
write entry points and wraps them; everything around the wrapped call is here:

- ``Engine``: the adapter's name and switches (``KVPROF_<ENGINE>``, ``..._WRITER``, ``..._DIR``),
  its version, where its sidecar goes and the process's ranks;
- ``Ranges`` / ``ReplayRanges``: kvprof's write ranges (NVTX domain ``kvprof``, message
  ``set_kv_buffer[<variant>] L<layer>``, payload = tokens) and, while a torch profiler records,
  a ``record_function`` range of the same name; a CUDA graph replay's range;
- ``LOCAL``: the write now running on this thread (so a hooked write inside a hooked write gets
  one range, and a graph capture can record it);
- ``Graphs`` / ``hook_graphs``: the writes each CUDA graph captured, and a range per replay;
- ``PluginState``: what the process did, for the sidecar: paths counted (``<engine>:<variant>``,
  ``writer:<name>:<path>``, ``<engine>:fallback``), entry points (``write_paths``), fallbacks,
  writes without a layer, the device, the write ledger (``Ledger``), the named writer built once;
  ``write_sidecar`` writes ``kvprof-<engine>.TP-<r>.pid-<p>.json`` atomically, never raising;
- ``Shadow``: the sampled shadow check (``KVPROF_<ENGINE>_SHADOW=N``): every N-th write's rows
  compared, right after it and on its device, with the inputs it was given (docs/verify.md).

What an adapter provides is listed in docs/architecture.md ("Engine plugins").
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kvprof.core.sidecar import (
    SIDECAR_SCHEMA,
    CapturedGraph,
    GraphWrite,
    ShadowMismatch,
    Sidecar,
    SidecarDevice,
    SidecarLedger,
    SidecarPool,
    SidecarShadow,
    encode_sidecar,
)
from kvprof.core.vocab import GRAPH_REPLAY_RANGE_FORMAT

# torch's CUDA graph class: its captures note the writes recorded into each graph, its replays
# carry a range naming the graph (kvprof.core.vocab.GRAPH_REPLAY_RANGE_FORMAT)
GRAPH_METHODS = ("capture_begin", "capture_end", "replay")

log = logging.getLogger("kvprof.engines")


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def line(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Engine:
    """One engine as its adapter describes it. ``ranks`` returns (global rank, TP rank, TP size);
    ``default_dir`` the sidecar folder when ``<env_dir>`` is unset."""

    name: str  # sglang, vllm: the sidecar's engine and the prefix of its native path keys
    package: str  # the distribution whose version the sidecar records
    ranks: Callable[[], tuple[int, int, int]]
    default_dir: Callable[[], str | None] = lambda: None
    version: Callable[[], str | None] | None = None  # default: the version of ``package``

    def engine_version(self) -> str | None:
        return self.version() if self.version is not None else package_version(self.package)

    @property
    def env_on(self) -> str:
        return f"KVPROF_{self.name.upper()}"

    @property
    def env_writer(self) -> str:
        return f"KVPROF_{self.name.upper()}_WRITER"

    @property
    def env_dir(self) -> str:
        return f"KVPROF_{self.name.upper()}_DIR"

    @property
    def env_shadow(self) -> str:
        return f"KVPROF_{self.name.upper()}_SHADOW"

    @property
    def fallback_key(self) -> str:
        """The paths key of a call the named writer left to the engine."""
        return f"{self.name}:fallback"

    def native_key(self, variant: str) -> str:
        """The paths key of the engine's own write of ``variant``."""
        return f"{self.name}:{variant}"

    def sidecar_dir(self) -> Path:
        return Path(os.environ.get(self.env_dir) or self.default_dir() or "/tmp")

    def writer_name(self) -> str | None:
        return (os.environ.get(self.env_writer) or "").strip() or None


def torch_ranks() -> tuple[int, int, int]:
    """(global rank, TP rank, TP size) from torch.distributed, else 0/0/1."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
            return rank, rank, dist.get_world_size()
    except (RuntimeError, ValueError) as exc:
        log.debug("kvprof: no torch.distributed rank (%s)", line(exc))
    return 0, 0, 1


class RangeMaker:
    """kvprof's NVTX domain and torch's record_function, looked up once for the hooks' ranges."""

    def __init__(self) -> None:
        import nvtx
        import torch

        from kvprof.core.vocab import NVTX_DOMAIN

        self.domain = nvtx.get_domain(NVTX_DOMAIN)
        self.profiler_enabled = torch._C._autograd._profiler_enabled
        self.record_function = torch.profiler.record_function


LOCAL = threading.local()


class Ranges(RangeMaker):
    """kvprof's write ranges (NVTX and record_function), names and attributes made once each."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[tuple[str, int | None], str] = {}
        self.attrs: dict[tuple[str, int | None, int], Any] = {}

    def of(self, variant: str, layer_id: int | None, tokens: int) -> tuple[str, Any]:
        """(range name, NVTX attributes); without a layer id the name has no ``L<layer>``
        (a form the analysis reads as layer -1)."""
        from kvprof.core.vocab import WRITE_RANGE_FORMAT

        key = (variant, layer_id)
        name = self.names.get(key)
        if name is None:
            name = WRITE_RANGE_FORMAT.format(variant=variant, layer=layer_id)
            if layer_id is None:
                name = name.rsplit(" L", 1)[0]
            self.names[key] = name
        akey = (variant, layer_id, tokens)
        attr = self.attrs.get(akey)
        if attr is None:
            from kvprof.kvcache.instrument import variant_color

            attr = self.attrs[akey] = self.domain.get_event_attributes(
                message=name, color=variant_color(variant), category=variant, payload=tokens)
        return name, attr

    def run(self, name: str, attr: Any, write: Any, *args: Any) -> Any:
        """``write(*args)`` inside the range (and a record_function range while a profiler records)."""
        local = LOCAL
        local.depth = 1
        self.domain.push_range(attr)
        try:
            if self.profiler_enabled():
                with self.record_function(name):
                    return write(*args)
            return write(*args)
        finally:
            self.domain.pop_range()
            local.depth = 0
            local.write = None


class Graphs:
    """The writes each CUDA graph captured, in capture order (``CapturedGraph``), and the
    number each graph gets; engines capture their graphs on the thread that runs the model."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.next_id = 0
        self.graphs: list[CapturedGraph] = []
        self.empty = 0  # graphs captured without a KV write
        self.ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.with_writes: set[int] = set()
        self.hook: str | None = None
        self.replays = 0  # replays of graphs with writes (a step that replays one wrote inside it)
        # the shadow checks that are on: told before a capture begins and after it ends, on the
        # capturing thread (their counts for the graph are allocated there, outside it)
        self.shadows: weakref.WeakSet[Any] = weakref.WeakSet()

    def begin(self, graph: Any) -> None:
        for shadow in list(self.shadows):
            try:
                shadow.before_capture()
            except Exception as exc:  # noqa: BLE001 - never stop a capture for kvprof
                log.warning("kvprof: shadow check before a CUDA graph capture: %s", line(exc))
        with self.lock:
            gid = self.next_id
            self.next_id += 1
        try:
            self.ids[graph] = gid
        except TypeError:  # not weakly referable: its replays get no range
            pass
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        stack.append((gid, []))

    def end(self) -> bool:
        """The innermost capture on this thread ended; True when it recorded writes."""
        stack = getattr(self.local, "stack", None)
        if not stack:
            return False
        gid, writes = stack.pop()
        for shadow in list(self.shadows):
            shadow.after_capture()
        with self.lock:
            if writes:
                self.graphs.append(CapturedGraph(graph=gid, writes=writes))
                self.with_writes.add(gid)
            else:
                self.empty += 1
        return bool(writes)

    def capturing(self) -> bool:
        return bool(getattr(self.local, "stack", None))

    def note(self, path: str) -> None:
        """A write counted as ``path``: recorded into the graph being captured on this thread, if any."""
        stack = getattr(self.local, "stack", None)
        if not stack:
            return
        what = getattr(LOCAL, "write", None)
        if what is None:
            return
        variant, layer_id, tokens, kernel, kernels = what
        stack[-1][1].append(GraphWrite(layer=layer_id if type(layer_id) is int else -1, variant=variant, path=path,
                                       tokens=int(tokens), kernel=kernel, kernels=int(kernels)))

    def replay_range(self, graph: Any) -> str | None:
        """The range name a replay of ``graph`` runs in, or None for a graph without writes."""
        try:
            gid = self.ids.get(graph)
        except TypeError:
            return None
        return GRAPH_REPLAY_RANGE_FORMAT.format(graph=gid) if gid in self.with_writes else None

    def snapshot(self) -> tuple[list[CapturedGraph], int]:
        with self.lock:
            return list(self.graphs), self.empty


class ReplayRanges(RangeMaker):
    """A range around a graph replay: NVTX, and record_function while a profiler records."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, Any] = {}

    def run(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        attr = self.attrs.get(name)
        if attr is None:
            attr = self.attrs[name] = self.domain.get_event_attributes(message=name)
        self.domain.push_range(attr)
        try:
            if self.profiler_enabled():
                with self.record_function(name):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)
        finally:
            self.domain.pop_range()


_REPLAY_RANGES: list[ReplayRanges] = []


def replay_ranges() -> ReplayRanges:
    if not _REPLAY_RANGES:
        _REPLAY_RANGES.append(ReplayRanges())
    return _REPLAY_RANGES[0]


def hook_graphs(cls: Any, graphs: Callable[[], Graphs], on_capture: Callable[[], Any]) -> str:
    """Wrap ``cls``'s (default ``torch.cuda.CUDAGraph``) capture_begin, capture_end and replay:
    where it was hooked, or why not (then graph-replayed writes are counted by kernel name only).
    ``graphs()`` is the record the wrappers use (looked up at each call); ``on_capture()`` runs
    after a capture that recorded writes (the adapter rewrites its sidecar). Never raises."""
    if cls is None:
        try:
            import torch

            cls = getattr(torch.cuda, "CUDAGraph", None)
        except Exception as exc:  # noqa: BLE001 - a torch without CUDA graphs
            return f"not hooked: torch.cuda does not import ({line(exc)})"
    if not isinstance(cls, type):
        return "not hooked: this torch has no torch.cuda.CUDAGraph"
    missing = [m for m in GRAPH_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        return f"not hooked: torch.cuda.CUDAGraph has no {', '.join(missing)}"
    where = f"{cls.__module__}.{cls.__qualname__}.{{{','.join(GRAPH_METHODS)}}}"
    if getattr(getattr(cls, "capture_begin"), "_kvprof_graph_hook", False):  # noqa: B009 - a type's attribute
        return where
    begin, end, replay = (getattr(cls, m) for m in GRAPH_METHODS)
    record = graphs()

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        record.begin(self)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            record.end()
            raise

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            if record.end():
                on_capture()

    def replay_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = record.replay_range(self)
        if name is None:
            return replay(self, *args, **kwargs)
        record.replays += 1
        return replay_ranges().run(name, replay, self, *args, **kwargs)

    for m, fn in zip(GRAPH_METHODS, (capture_begin, capture_end, replay_hooked)):
        fn.__name__ = f"kvprof_{m}"
        fn.__wrapped__ = getattr(cls, m)  # type: ignore[attr-defined]
        fn._kvprof_graph_hook = True  # type: ignore[attr-defined]
        setattr(cls, m, fn)
    log.info("kvprof: CUDA graph captures noted through %s", where)
    return where


def native(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any], state: PluginState, path: str,
           write_path: str) -> Any:
    """The engine's own write, counted as ``path`` (and ``write_path``)."""
    state.count(path, write_path)
    return original(*args, **kwargs)


def writer_kernel(writer: Any) -> tuple[str | None, int]:
    """(a substring of the writer's kernel name, kernels per write) where the writer says it
    (``kernel_name``), else (None, 1): its graph-replayed writes are then counted by name only."""
    name = getattr(writer, "kernel_name", None)
    return (name if isinstance(name, str) and name else None), 1


class Ledger:
    """Per forward step, the writes the engine was asked to make (the batch's tokens times the
    layers that keep a cache) against the writes a hook saw, by layer; and the paths that wrote
    without a hook's range (``unseen``: a reason -> writes), where an adapter can name them.

    ``step(tokens, layers)`` (or ``step_by_layer``) notes a step whose writes were counted as they
    came; ``saw(layer, tokens)`` counts a hooked write. An adapter whose step point sees the step
    before its writes opens it with ``begin`` and closes it with ``end``: the writes seen and the
    paths named in between are the step's, kept or dropped with it (a forward that captured a
    CUDA graph is no step: its writes ran under capture or as the capture's warm-up)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps = 0
        self.expected: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.unseen: dict[str, int] = {}
        self.graph_steps = 0  # steps replayed from a CUDA graph: their writes ran inside the replay
        self.open: tuple[dict[int, int], dict[str, int]] | None = None  # the step begun: seen, unseen

    def begin(self) -> None:
        """Open a step: the writes seen until ``end`` are its own."""
        with self.lock:
            self.open = ({}, {})

    def end(self, tokens: dict[int, int] | None, graph: bool = False) -> None:
        """Close the step ``begin`` opened: ``tokens`` (layer -> tokens asked) with the writes seen
        since; ``None`` drops the step and what was seen in it. Without an open step, nothing."""
        with self.lock:
            if self.open is None:
                return
            seen, unseen = self.open
            self.open = None
            if tokens is None:
                return
            self.steps += 1
            if graph:  # counted apart, with the eager writes around its replays (the graph record covers it)
                self.graph_steps += 1
                return
            for layer, n in tokens.items():
                self.expected[layer] = self.expected.get(layer, 0) + n
            for layer, n in seen.items():
                self.seen[layer] = self.seen.get(layer, 0) + n
            for reason, n in unseen.items():
                self.unseen[reason] = self.unseen.get(reason, 0) + n

    def step(self, tokens: int, layers: list[int] | tuple[int, ...], graph: bool = False) -> None:
        with self.lock:
            self.steps += 1
            if graph:  # the graph's replay writes without calling any hook: not expected of them
                self.graph_steps += 1
                return
            for layer in layers:
                self.expected[layer] = self.expected.get(layer, 0) + tokens

    def step_by_layer(self, tokens: dict[int, int], graph: bool = False) -> None:
        """A step whose layers were asked for different token counts (layer -> tokens)."""
        with self.lock:
            self.steps += 1
            if graph:
                self.graph_steps += 1
                return
            for layer, n in tokens.items():
                self.expected[layer] = self.expected.get(layer, 0) + n

    def saw(self, layer: int | None, tokens: int) -> None:
        key = layer if type(layer) is int else -1
        with self.lock:
            seen = self.open[0] if self.open is not None else self.seen
            seen[key] = seen.get(key, 0) + tokens

    def bypass(self, reason: str, n: int = 1) -> None:
        """A path the engine took around the hooked writes, named (a model's ``save_kv_cache=False``
        ...), with its tokens: what analyze names where writes went unseen."""
        with self.lock:
            unseen = self.open[1] if self.open is not None else self.unseen
            unseen[reason] = unseen.get(reason, 0) + n

    def record(self) -> SidecarLedger | None:
        with self.lock:
            if not self.steps:
                return None
            return SidecarLedger(steps=self.steps, graph_steps=self.graph_steps,
                                 expected={str(k): v for k, v in sorted(self.expected.items())},
                                 seen={str(k): v for k, v in sorted(self.seen.items())},
                                 unseen_paths=dict(self.unseen))


class PluginState:
    """What this process did, for the sidecar; the named writer, built once."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.writer_name: str | None = None
        self.writer: Any = None
        self.writer_error: str | None = None
        self.writer_layout = "mha"
        self.hooked: list[str] = []
        self.pools: dict[int, dict[str, Any]] = {}
        self.paths: dict[str, int] = {}
        self.write_paths: dict[str, int] = {}
        self.fallbacks: dict[str, int] = {}
        self.unattributed: dict[str, int] = {}
        self.device: SidecarDevice | None = None
        self.ledger = Ledger()
        self.shadow = Shadow(0)  # the adapter's plugin() sets it from KVPROF_<ENGINE>_SHADOW
        self.lock = threading.Lock()

    # the record the counts go to, and the ranks: the adapter may look them up elsewhere
    def graphs(self) -> Graphs:
        return GRAPHS

    def ranks(self) -> tuple[int, int, int]:
        return self.engine.ranks()

    def saw(self, layer: int | None, tokens: int) -> None:
        """A hooked write of ``tokens`` rows in the ledger; one being captured into a CUDA graph is
        not (the capture is no step; the graph's replays are counted as graph steps)."""
        if not self.graphs().capturing():
            self.ledger.saw(layer, tokens)

    def count(self, path: str, write_path: str) -> None:
        """One write: ``path`` in detail (whose kernel, which path), ``write_path`` which entry
        point wrote it or that the named writer fell back."""
        self.paths[path] = self.paths.get(path, 0) + 1
        self.write_paths[write_path] = self.write_paths.get(write_path, 0) + 1
        self.graphs().note(path)

    def note(self, reason: str) -> None:
        """A write counted and ranged without its layer (logged once per reason)."""
        n = self.unattributed.get(reason, 0)
        if not n:
            log.warning("kvprof: a KV write with no layer: %s", reason)
        self.unattributed[reason] = n + 1

    def fallback(self, reason: str) -> None:
        n = self.fallbacks.get(reason, 0)
        if not n:
            log.warning("kvprof: %s: %s's own write for %s", self.writer_name, self.engine.name, reason)
        self.fallbacks[reason] = n + 1
        key = self.engine.fallback_key
        self.paths[key] = self.paths.get(key, 0) + 1

    def _writer(self) -> Any:
        if self.writer is None and self.writer_error is None:
            if self.writer_name is None:  # the hooks ask only once a writer is named
                self.writer_error = "no writer named"
                return None
            try:
                from kvprof.kvcache.writers import create_writer

                self.writer = create_writer(self.writer_name, layout=self.writer_layout)
            except Exception as exc:  # noqa: BLE001 - an unknown name or a writer that fails to build
                self.writer_error = line(exc)
                log.warning("kvprof: writer %s unavailable (%s): %s's own writes", self.writer_name,
                            self.writer_error, self.engine.name)
        return self.writer

    def pool_info(self, pool: Any) -> dict[str, Any]:
        return self.pools.setdefault(id(pool), {})

    def sidecar(self) -> Sidecar:
        import msgspec

        from kvprof import __version__

        rank, tp_rank, tp_size = self.ranks()
        record = self.graphs()
        graphs, empty = record.snapshot()
        version = self.engine.engine_version()
        return Sidecar(
            schema=SIDECAR_SCHEMA, engine=self.engine.name, engine_version=version, kvprof_version=__version__,
            sglang_version=version if self.engine.name == "sglang" else None,
            pid=os.getpid(), rank=rank, tp_rank=tp_rank, tp_size=tp_size,
            hooked=list(self.hooked), writer=self.writer_name, writer_error=self.writer_error,
            pools=[msgspec.convert(p, SidecarPool) for p in list(self.pools.values())],
            paths=dict(self.paths), write_paths=dict(self.write_paths),
            fallbacks=dict(self.fallbacks), unattributed=dict(self.unattributed), device=self.device,
            graphs=graphs, graphs_without_writes=empty, graph_hook=record.hook, ledger=self.ledger.record(),
            shadow=self.shadow.record() if self.shadow.every else None, canary=self.canary_record(),
        )

    def canary_record(self) -> Any:
        """The engine's own canary's violations (``SidecarCanary``), where its adapter reads them."""
        return None

    def shadow_on(self) -> None:
        """The shadow check from ``KVPROF_<ENGINE>_SHADOW`` (a refused value is logged, check off)."""
        every, problem = shadow_every(self.engine)
        if problem:
            log.warning("kvprof: %s", problem)
        self.shadow = Shadow(every)
        if every:
            log.info("kvprof: shadow check of every %d-th KV write", every)

    def shadow_due(self, device: Any) -> str:
        """How this write is checked: ``EAGER`` (compared right after it), ``IN_GRAPH`` (it is being
        captured into a CUDA graph: a kernel recorded after it compares at every replay), or ""
        (not sampled, or not checkable: counted as skipped)."""
        shadow = self.shadow
        if not shadow.every or not shadow.due():
            return ""
        try:
            if shadow.capturing(device):
                if shadow.graph_row_free():
                    return IN_GRAPH
                shadow.skip(SKIP_CAPTURE)
                return ""
        except Exception as exc:  # noqa: BLE001 - never stop a write for the check
            shadow.skip(f"capture state not readable ({line(exc)})")
            return ""
        return EAGER

    def write_sidecar(self) -> Path | None:
        """Write (or rewrite) this process's sidecar; a failure is logged, never raised."""
        if not self.pools:
            return None
        with self.lock:
            try:
                from kvprof.core.atomic import atomic_write_bytes
                from kvprof.core.rundir import RunDir

                doc = self.sidecar()
                path = self.engine.sidecar_dir() / RunDir.sidecar_name(doc.tp_rank, doc.pid, self.engine.name)
                atomic_write_bytes(path, encode_sidecar(doc))
                return path
            except Exception as exc:  # noqa: BLE001 - a sidecar must never take the server down
                log.warning("kvprof: cannot write the %s sidecar (%s)", self.engine.name, line(exc))
                return None


GRAPHS = Graphs()


def describe_device(device: Any) -> SidecarDevice | None:
    """``device`` as kvprof's manifest describes one (name, peak bandwidth and its source);
    None where it cannot be read (never raises: the sidecar goes without it)."""
    try:
        import msgspec
        import torch

        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        from kvprof.kvcache.devinfo import device_properties

        return msgspec.convert(device_properties(dev), SidecarDevice)
    except Exception as exc:  # noqa: BLE001 - a description only
        log.warning("kvprof: cannot describe the KV cache's device (%s)", line(exc))
        return None


# --- the sampled shadow check (KVPROF_<ENGINE>_SHADOW=N) --------------------------------------

SHADOW_FIRST = 8  # mismatches named in the sidecar, first come
SHADOW_PENDING = 256  # compared writes kept on the device before their counts are read (one sync)
SKIP_CAPTURE = ("inside a CUDA graph capture with no counts row for it (a graph holds at most "
                "SHADOW_GRAPH_ROWS checked writes; counts are allocated where a capture begins on CUDA)")
SHADOW_GRAPH_ROWS = 64  # checked writes one captured graph can hold
EAGER, IN_GRAPH = "eager", "in_graph"  # how a sampled write is checked (PluginState.shadow_due)


def shadow_every(engine: Engine) -> tuple[int, str | None]:
    """(N, None) from ``KVPROF_<ENGINE>_SHADOW`` (0: off), or (0, why the value is refused)."""
    raw = (os.environ.get(engine.env_shadow) or "").strip()
    if not raw:
        return 0, None
    try:
        every = int(raw)
    except ValueError:
        return 0, f"{engine.env_shadow}={raw[:40]!r} is not a whole number: shadow check off"
    if every < 0:
        return 0, f"{engine.env_shadow}={every} is negative: shadow check off"
    return every, None


class Shadow:
    """Every ``every``-th hooked write, its rows compared with the inputs it was given, right after it.

    ``due()`` says whether this write is sampled; the adapter then copies the write's inputs
    (``before``: SGLang's own path divides the caller's K/V in place) and, after the write, hands
    ``compare`` the cache's K and V rows as gathered tensors and the rows expected, both in the
    cache's storage dtype. The comparison runs where the cache is (on a GPU: on the device,
    no host read); its counts stay on the device until ``resolve`` (the sidecar, or every
    ``SHADOW_PENDING`` compared writes) reads them, in one transfer. A sampled write the
    adapter cannot check is ``skip(reason)``: counted by reason, never silently dropped."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.lock = threading.Lock()
        self.calls = 0
        self.sampled = 0
        self.checked = 0
        self.mismatched = 0
        self.rows_checked = 0
        self.rows_mismatched = 0
        self.skipped: dict[str, int] = {}
        self.first: list[dict[str, Any]] = []
        self.pending: list[tuple[int | None, str, Any, int, int | None]] = []  # (layer, variant, codes, rows, pad)
        # inside CUDA graphs: per capture on this thread a block of counts rows (allocated before
        # the capture begins), and per checked captured write (layer, variant, its counts row)
        self.blocks = threading.local()
        self.in_graphs: list[tuple[int | None, str, Any]] = []
        if every > 0:
            GRAPHS.shadows.add(self)

    def due(self) -> bool:
        if self.every <= 0:
            return False
        # every hooked write passes here: no lock on this path (a lock is most of its cost); the
        # count is exact where one thread writes, as the model runner of either engine does
        self.calls += 1
        if self.calls % self.every:
            return False
        with self.lock:
            self.sampled += 1
        return True

    def skip(self, reason: str) -> None:
        with self.lock:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def capturing(self, device: Any) -> bool:
        """Whether this thread is capturing a CUDA graph (kvprof's record, or torch's own probe)."""
        if GRAPHS.capturing():
            return True
        kind = getattr(device, "type", None) or str(device or "").split(":", 1)[0]  # SGLang's pool.device: "cuda"
        if kind != "cuda":
            return False
        import torch

        return bool(torch.cuda.is_current_stream_capturing())

    def before_capture(self) -> None:
        """A CUDA graph capture is about to begin on this thread: its counts rows, allocated now
        (outside the graph, so a replay neither allocates nor resets them)."""
        import torch

        stack = getattr(self.blocks, "stack", None)
        if stack is None:
            stack = self.blocks.stack = []
        block = None
        if self.every and torch.cuda.is_available():
            from kvprof.integrations.shadow_kernel import COUNTS, FIRST, warm

            device = torch.device("cuda", torch.cuda.current_device())
            warm(device)
            block = torch.zeros(SHADOW_GRAPH_ROWS, COUNTS, dtype=torch.int64, device=device)
            block[:, FIRST] = -1
        stack.append([block, 0])

    def after_capture(self) -> None:
        stack = getattr(self.blocks, "stack", None)
        if stack:
            stack.pop()

    def graph_row_free(self) -> bool:
        stack: list[list[Any]] | None = getattr(self.blocks, "stack", None)
        return stack is not None and bool(stack) and stack[-1][0] is not None and stack[-1][1] < SHADOW_GRAPH_ROWS

    def compare_in_graph(self, layer: int | None, variant: str, slots: Any, k: Any, v: Any, k_cache: Any,
                         v_cache: Any, rows: int, pad: int | None = None) -> None:
        """Record, right after a write being captured, the kernel that compares its rows at every
        replay (``kvprof.integrations.shadow_kernel``): ``k``/``v`` [n, heads, dim] as the cache
        stores them, ``k_cache``/``v_cache`` [blocks, block_size, heads, dim] views."""
        from kvprof.integrations import shadow_kernel

        why = shadow_kernel.refusal(slots, k, v, k_cache, v_cache)
        if why is not None:
            self.skip(f"{variant} in a CUDA graph: {why}")
            return
        stack = getattr(self.blocks, "stack", None)
        if not stack or stack[-1][0] is None or stack[-1][1] >= SHADOW_GRAPH_ROWS:
            self.skip(SKIP_CAPTURE)
            return
        block, used = stack[-1]
        row = block[used]
        stack[-1][1] = used + 1
        shadow_kernel.compare_rows(slots, k, v, k_cache, v_cache, rows, pad, row)
        with self.lock:
            self.in_graphs.append((layer, variant, row))

    def graph_totals(self) -> tuple[int, int, int, int, int, list[dict[str, Any]]]:
        """(replays checked, rows held, rows wrong, replays with a wrong row, captured writes checked,
        the first mismatches) of the writes checked inside CUDA graphs, read from the device."""
        with self.lock:
            in_graphs = list(self.in_graphs)
        if not in_graphs or GRAPHS.capturing():
            return 0, 0, 0, 0, len(in_graphs), []
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return 0, 0, 0, 0, len(in_graphs), []
        counts = torch.stack([row for _, _, row in in_graphs]).to("cpu").tolist()
        first = [{"layer": layer if type(layer) is int else -1, "variant": variant, "slot": int(c[4]),
                  "rows": int(c[2])} for (layer, variant, _), c in zip(in_graphs, counts) if c[4] >= 0]
        replays, held, wrong, bad = (sum(int(c[i]) for c in counts) for i in range(4))
        return replays, held, wrong, bad, len(in_graphs), first

    def compare(self, layer: int | None, variant: str, slots: Any, k_got: Any, v_got: Any, k_want: Any,
                v_want: Any, rows: int, pad: int | None = None) -> None:
        """Compare one write: ``slots`` [n] (int64), ``k_got``/``v_got`` the cache's rows at those slots
        (clamped into the cache) and ``k_want``/``v_want`` the expected rows (each [n, ...], same dtype).
        Bitwise. Which tokens are held to their row (a slot in ``[0, rows)``, not ``pad``, the
        engine's dummy slot, and no other token's) is decided on the host when the counts are
        read (``resolve``), so the device runs only the comparison: a few launches, no sort."""
        import torch

        n = int(slots.shape[0])
        if not n:
            self.skip("no token to check (an empty write)")
            return
        bad = (k_got.reshape(n, -1).view(torch.uint8) != k_want.reshape(n, -1).view(torch.uint8)).any(1)
        bad |= (v_got.reshape(n, -1).view(torch.uint8) != v_want.reshape(n, -1).view(torch.uint8)).any(1)
        # one fresh tensor carries both: a wrong token's slot (>= 0), a right one's as -2 - slot (<= -1)
        code = torch.where(bad, slots, -2 - slots)
        resolve = False
        with self.lock:
            self.pending.append((layer, variant, code, rows, pad))
            resolve = len(self.pending) >= SHADOW_PENDING
        if resolve:
            self.resolve()

    def resolve(self) -> None:
        """Read the pending comparisons (one device->host transfer) and count them; never inside a capture."""
        if not self.pending or GRAPHS.capturing():
            return
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return
        with self.lock:
            pending, self.pending = self.pending, []
        if not pending:
            return
        try:
            codes = torch.cat([c.reshape(-1).long() for _, _, c, _, _ in pending])
            flat = (codes.to("cpu") if codes.device.type != "cpu" else codes).tolist()
        except Exception as exc:  # noqa: BLE001 - a failed read is counted, never raised into the engine
            for _ in pending:
                self.skip(f"counts not readable ({line(exc)})")
            return
        at = 0
        with self.lock:
            for layer, variant, code, rows, pad in pending:
                n = int(code.numel())
                part, at = flat[at:at + n], at + n
                slots = [c if c >= 0 else -2 - c for c in part]
                held = held_tokens(slots, rows, pad)
                if not any(held):
                    reason = "no row to hold (every slot padding or shared by several tokens)"
                    self.skipped[reason] = self.skipped.get(reason, 0) + 1
                    continue
                wrong = [i for i, c in enumerate(part) if c >= 0 and held[i]]
                self.checked += 1
                self.rows_checked += sum(held)
                if wrong:
                    self.mismatched += 1
                    self.rows_mismatched += len(wrong)
                    if len(self.first) < SHADOW_FIRST:
                        self.first.append({"layer": layer if type(layer) is int else -1, "variant": variant,
                                           "slot": slots[wrong[0]], "rows": len(wrong)})

    def record(self) -> SidecarShadow:
        self.resolve()
        try:
            replays, held, wrong, bad, captured, first = self.graph_totals()
        except Exception as exc:  # noqa: BLE001 - a failed read is counted, never raised into the engine
            replays = held = wrong = bad = captured = 0
            first = []
            self.skip(f"graph counts not readable ({line(exc)})")
        with self.lock:
            firsts = (self.first + first)[:SHADOW_FIRST]
            return SidecarShadow(every=self.every, writes=self.calls, sampled=self.sampled,
                                 checked=self.checked + replays, mismatched=self.mismatched + bad,
                                 rows_checked=self.rows_checked + held, rows_mismatched=self.rows_mismatched + wrong,
                                 skipped=dict(self.skipped), first_mismatches=[ShadowMismatch(**m) for m in firsts],
                                 in_graphs=captured, replayed=replays)


def held_tokens(slots: list[int], rows: int, pad: int | None) -> list[bool]:
    """Per token: whether the check holds it to its row: its slot in ``[0, rows)``, not ``pad``
    (the engine's dummy slot, where padding tokens write), and no other token's (a slot several
    tokens write keeps one of them)."""
    seen: dict[int, int] = {}
    for s in slots:
        seen[s] = seen.get(s, 0) + 1
    return [0 <= s < rows and s != pad and seen[s] == 1 for s in slots]


def to_store(x: Any, dtype: Any, scale: Any, divide: bool) -> Any:
    """Input rows as a cache of ``dtype`` stores them, without a host read: the input's dtype
    kept when it is the cache's; else divided by ``scale`` in the input's dtype (``divide``:
    SGLang's own ``div_``) or multiplied by fp32(1)/fp32(scale) (kvprof's writers, the
    reference's ``convert_for_cache``), then cast; fp8 as its bytes."""
    import torch

    from kvprof.kvcache.dtypes import store_dtype_for

    if x.dtype != dtype:
        if scale is not None:
            if divide:
                x = x / scale
            else:
                inv = (1.0 / scale.float()) if isinstance(scale, torch.Tensor) else _inverse(scale)
                x = (x.float() * inv).to(x.dtype)
        x = x.to(dtype)
    store = store_dtype_for(dtype)
    return x.view(store) if store != dtype else x


def _inverse(scale: float) -> float:
    from kvprof.kvcache.dtypes import inverse_scale

    return inverse_scale(scale)
