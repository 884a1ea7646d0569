"""Build Kineto traces shaped like kvprof's real H200 captures, with known answers.

Why: tests need traces whose right numbers are known by construction (kernels per write,
spans, overlap between streams), the benchmark needs one of any size, and the GPU is
not here. The event shapes copy a real torch 2.11 trace (tests/fixtures/real): ``ts``
relative to ``baseTimeNanoseconds``, kernels on pid=device/tid=stream with
``args.correlation``, ``ac2g`` flows, ``gpu_user_annotation`` twins, ``cuda_sync``
events, graph replays as one ``cudaGraphLaunch`` whose kernels share its correlation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvprof.core.vocab import PHASE_RANGE_FORMAT, STEP_RANGE_FORMAT, WRITE_RANGE_FORMAT

BASE_NS = 1_790_857_026_000_000_000
T0_US = 5_355_310_898_000.0
INDEX_KERNEL = ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
                "at::native::index_put_kernel_impl<at::native::OpaqueType<2> > > >(long)")
FUSED_KERNEL = "_store_kv_fused"


@dataclass
class KernelSpec:
    """One GPU activity of a write: stream, offset from the write's GPU start, duration (ns)."""

    stream: int
    offset_ns: int
    dur_ns: int
    name: str = INDEX_KERNEL


@dataclass
class WriteSpec:
    kernels: list[KernelSpec]


@dataclass
class PhaseSpec:
    phase: str  # "decode" | "prefill"
    size: int
    steps: int
    graph: bool = False


@dataclass
class TraceSpec:
    variant: str = "two_stream"
    layers: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    phases: list[PhaseSpec] = field(default_factory=lambda: [PhaseSpec("decode", 8, 2, graph=True)])
    write: WriteSpec = field(default_factory=lambda: WriteSpec([KernelSpec(7, 0, 2500), KernelSpec(7, 2800, 2500)]))
    write_gap_ns: int = 1500  # GPU idle between consecutive writes
    host_write_ns: int = 20_000  # host duration of an eager write range
    launch_ns: int = 5_000  # host duration of one launch call
    launch_delay_ns: int = 12_000  # launch call start -> its kernel's start (eager)
    cpu_ops_per_write: int = 2
    fused: bool = False
    paths: dict[str, int] | None = None
    bytes_per_token: int = 1024
    kernels_per_write: int | None = None  # metadata; default: len(write.kernels)
    pid: int = 450
    with_sync: bool = True


def _x(cat: str, name: str, pid: Any, tid: Any, ts_ns: int, dur_ns: int,
       args: dict[str, Any] | None = None) -> dict[str, Any]:
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
         "ts": round(T0_US + ts_ns / 1000.0, 3), "dur": round(dur_ns / 1000.0, 3)}
    if args is not None:
        e["args"] = args
    return e


def _paths_key(spec: TraceSpec) -> str:
    """The write path a write of ``spec`` takes, as the pool counts it."""
    if spec.fused:
        return "fused"
    return "two_streams" if len({k.stream for k in spec.write.kernels}) > 1 else "two_copies"


def build(spec: TraceSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trace document, expected answers). Times in the answers are ns relative to T0."""
    if not spec.layers or not spec.write.kernels:
        raise ValueError("a synthetic trace needs at least one layer and one kernel per write")
    ev: list[dict[str, Any]] = []
    pid = spec.pid
    corr = 1000
    ext = 1
    t = 10_000  # host clock, ns after T0
    expected: dict[str, Any] = {"writes": [], "steps": []}
    kpw = spec.kernels_per_write if spec.kernels_per_write is not None else len(spec.write.kernels)
    paths: dict[str, int] = {}
    w_span = max(k.offset_ns + k.dur_ns for k in spec.write.kernels)
    for ph in spec.phases:
        key = "bs" if ph.phase == "decode" else "tokens"
        phase_start = t
        t += 1_000
        for s in range(ph.steps):
            step_start = t
            t += 2_000
            step_name = STEP_RANGE_FORMAT.format(phase=ph.phase, size_key=key, size=ph.size, step=s)
            gpu_t = t + spec.launch_delay_ns
            if ph.graph:
                corr += 1
                ev.append(_x("cuda_runtime", "cudaGraphLaunch", pid, pid, t, spec.launch_ns,
                             {"cbid": 311, "correlation": corr}))
                ev.append({"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": round(T0_US + t / 1000, 3),
                           "cat": "ac2g", "name": "ac2g"})
                step_gpu0 = gpu_t
                for layer in spec.layers:
                    for k in spec.write.kernels:
                        ev.append(_x("kernel", k.name, 0, k.stream, gpu_t + k.offset_ns, k.dur_ns, {
                            "External id": ext, "queued": 0, "device": 0, "context": 1, "stream": k.stream,
                            "correlation": corr, "registers per thread": 32, "shared memory": 0,
                            "grid": [2, 1, 1], "block": [128, 1, 1]}))
                    expected["writes"].append(_expect(spec, ph, s, layer, gpu_t, "graph_order"))
                    gpu_t += w_span + spec.write_gap_ns
                    paths_key = _paths_key(spec)
                    paths[paths_key] = paths.get(paths_key, 0) + 1
                t += spec.launch_ns + 1_000
                step_gpu_end = gpu_t - spec.write_gap_ns
            else:
                step_gpu0 = None
                for layer in spec.layers:
                    w_start = t
                    ev.append(_x("user_annotation", WRITE_RANGE_FORMAT.format(variant=spec.variant, layer=layer),
                                 pid, pid, w_start, spec.host_write_ns, {"External id": ext}))
                    ext += 1
                    inner = w_start + 500
                    for _ in range(spec.cpu_ops_per_write):
                        ev.append(_x("cpu_op", "aten::index_put_", pid, pid, inner, 800, {"External id": ext}))
                        ext += 1
                        inner += 900
                    lt = inner
                    gpu_w0 = max(gpu_t, lt + spec.launch_delay_ns)
                    step_gpu0 = gpu_w0 if step_gpu0 is None else step_gpu0
                    for k in spec.write.kernels:
                        corr += 1
                        ev.append(_x("cuda_runtime", "cudaLaunchKernel", pid, pid, lt, spec.launch_ns,
                                     {"External id": ext, "cbid": 211, "correlation": corr}))
                        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": round(T0_US + lt / 1000, 3),
                                   "cat": "ac2g", "name": "ac2g"})
                        ev.append(_x("kernel", k.name, 0, k.stream, gpu_w0 + k.offset_ns, k.dur_ns, {
                            "External id": ext, "queued": 0, "device": 0, "context": 1, "stream": k.stream,
                            "correlation": corr, "registers per thread": 32, "shared memory": 0,
                            "grid": [2, 1, 1], "block": [128, 1, 1]}))
                        ev.append({"ph": "f", "id": corr, "pid": 0, "tid": k.stream,
                                   "ts": round(T0_US + (gpu_w0 + k.offset_ns) / 1000, 3), "cat": "ac2g",
                                   "name": "ac2g", "bp": "e"})
                        lt += spec.launch_ns + 200
                    if spec.with_sync and len({k.stream for k in spec.write.kernels}) > 1:
                        ev.append(_x("cuda_sync", "Stream Wait Event", 0, spec.write.kernels[-1].stream,
                                     gpu_w0, 100, {"cuda_sync_kind": "Stream Wait Event",
                                                   "stream": spec.write.kernels[-1].stream,
                                                   "correlation": corr, "device": 0, "context": 1}))
                    ev.append(_x("gpu_user_annotation", WRITE_RANGE_FORMAT.format(variant=spec.variant, layer=layer),
                                 0, spec.write.kernels[0].stream, gpu_w0, w_span, {"External id": ext}))
                    exp = _expect(spec, ph, s, layer, gpu_w0, "correlation")
                    exp["launch_delay_ns"] = _first_delay(spec, inner, gpu_w0)
                    exp["host_dur_ns"] = spec.host_write_ns
                    expected["writes"].append(exp)
                    paths_key = _paths_key(spec)
                    paths[paths_key] = paths.get(paths_key, 0) + 1
                    gpu_t = gpu_w0 + w_span + spec.write_gap_ns
                    t = w_start + spec.host_write_ns + 300
                step_gpu_end = gpu_t - spec.write_gap_ns
            t = max(t, step_gpu_end - spec.launch_delay_ns) + 1_000
            ev.append(_x("user_annotation", step_name, pid, pid, step_start, t - step_start, {"External id": ext}))
            ext += 1
            if step_gpu0 is None:  # spec.layers is not empty (checked above)
                raise AssertionError("a step without writes")
            expected["steps"].append({"phase": ph.phase, "size": ph.size, "step": s, "dur_ns": t - step_start,
                                      "gpu_span_ns": step_gpu_end - step_gpu0})
            t += 3_000
        ev.append(_x("user_annotation", PHASE_RANGE_FORMAT.format(phase=ph.phase, size_key=key, size=ph.size),
                     pid, pid, phase_start, t - phase_start, {"External id": ext}))
        ext += 1
    ev.append({"ph": "X", "cat": "Trace", "ts": T0_US, "dur": t / 1000, "pid": "Spans", "tid": "PyTorch Profiler",
               "name": "PyTorch Profiler (0)", "args": {"Op count": 0}})
    ev.append({"name": "process_name", "ph": "M", "ts": T0_US, "pid": pid, "tid": 0, "args": {"name": "python"}})
    meta = {
        "variant": spec.variant, "fused": spec.fused, "layers": spec.layers, "input_dtype": "bf16",
        "cache_dtype": "bf16", "bytes_per_token": spec.bytes_per_token,
        "kernels_per_write": {f"{p.phase} {p.size}": kpw for p in spec.phases},
        "paths": spec.paths if spec.paths is not None else paths,
        "device": {"name": "NVIDIA H200", "peak_bandwidth_gbs": 4800.0, "copy_rate_gbs": 4300.0},
    }
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132}],
        "kvprof": meta,
        "distributedInfo": {"rank": 0, "world_size": 1, "backend": "none"},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": ev,
        "traceName": "synthetic",
    }
    return doc, expected


def _first_delay(spec: TraceSpec, first_launch: int, gpu_w0: int) -> int:
    """Launch -> start of the write's first-starting kernel (launches are spaced launch_ns + 200)."""
    best = None
    for i, k in enumerate(spec.write.kernels):
        start = gpu_w0 + k.offset_ns
        if best is None or start < best[0]:
            best = (start, first_launch + i * (spec.launch_ns + 200))
    if best is None:  # build() refuses a write without kernels
        raise AssertionError("a write without kernels")
    return best[0] - best[1]


def _expect(spec: TraceSpec, ph: PhaseSpec, step: int, layer: int, gpu0: int, how: str) -> dict[str, Any]:
    ks = spec.write.kernels
    starts = [gpu0 + k.offset_ns for k in ks]
    ends = [gpu0 + k.offset_ns + k.dur_ns for k in ks]
    return {
        "phase": ph.phase, "size": ph.size, "step": step, "layer": layer, "attribution": how,
        "gpu_ops": len(ks), "streams": len({k.stream for k in ks}),
        "gpu_span_ns": max(ends) - min(starts), "gpu_busy_ns": sum(k.dur_ns for k in ks),
        "tokens": ph.size,
    }


def dumps(doc: dict[str, Any]) -> bytes:
    """Kineto-like text (``"key": value`` with spaces, as HTA's rank regex expects)."""
    return json.dumps(doc).encode()


SGLANG_STORE_KERNEL = ("void sglang::store_kvcache_kernel<256l, 256l, 32u, true, long>"
                       "(sglang::StoreKVCacheParams)")
ENGINE_GEMM = "nvjet_hsh_128x64_64x5_1x2_h_bz_coopA_NTN"
ENGINE_ATTENTION = "void flashinfer::BatchDecodeWithPagedKVCacheKernel<128u>(...)"


@dataclass
class EngineReplaySpec:
    """An engine's decode: replays of CUDA graphs captured by the engine, no kvprof steps.

    Each replay is one ``cudaGraphLaunch`` whose kernels (correlated to it) are, per layer,
    a GEMM, the layer's write kernel(s), the attention; ``graphs`` maps a graph number to its
    batch size, ``replays`` lists the graph each replay runs; with ``replay_ranges`` each
    launch sits in the SGLang plugin's ``kvprof.graph_replay[<graph>]`` host range.
    """

    layers: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    graphs: dict[int, int] = field(default_factory=lambda: {0: 8, 1: 16})
    replays: list[int] = field(default_factory=lambda: [0, 1, 0])
    write_kernel: str = SGLANG_STORE_KERNEL
    write_ns: int = 900
    replay_ranges: bool = True
    pid: int = 1584
    # per replay, layers whose write kernel is left out (a replay that does not follow the record)
    drop: dict[int, list[int]] = field(default_factory=dict)
    # the engine's own step annotation around each forward: "sglang" (step[DECODE bs=<n>]), "vllm"
    # (gpu_model_runner: forward), or None
    step_ranges: str | None = None
    eager: bool = False  # each kernel launched by its own cudaLaunchKernel (no CUDA graph)
    eager_replays: list[int] = field(default_factory=list)  # these forwards (by index) launched eagerly


def build_engine(spec: EngineReplaySpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trace document, expected writes: one per replayed layer, in order, with its kernel's start)."""
    from kvprof.core.vocab import GRAPH_REPLAY_RANGE_FORMAT

    ev: list[dict[str, Any]] = []
    pid, corr, t, gpu_t = spec.pid, 5000, 10_000, 40_000
    writes: list[dict[str, Any]] = []
    step_name = {"sglang": "step[DECODE bs={bs}]", "vllm": "gpu_model_runner: forward", None: None}[spec.step_ranges]
    for i, g in enumerate(spec.replays):
        eager = spec.eager or i in spec.eager_replays
        launch_ns = 5_000 if not eager else 1_000 * 3 * len(spec.layers) + 1_000
        corr += 1
        if spec.replay_ranges:
            ev.append(_x("user_annotation", GRAPH_REPLAY_RANGE_FORMAT.format(graph=g), pid, pid, t - 500, 8_000))
        if step_name is not None:
            ev.append(_x("user_annotation", step_name.format(bs=spec.graphs[g]), pid, pid, t - 1_000,
                         launch_ns + 2_000))
        if not eager:
            ev.append(_x("cuda_runtime", "cudaGraphLaunch", pid, pid, t, 5_000, {"cbid": 311, "correlation": corr}))
        gpu_t = max(gpu_t, t + 12_000)
        host_t = t
        for layer in spec.layers:
            kernels = [(ENGINE_GEMM, 4_000)]
            if layer not in spec.drop.get(i, []):
                kernels.append((spec.write_kernel, spec.write_ns))
                writes.append({"replay": i, "graph": g, "layer": layer, "tokens": spec.graphs[g],
                               "start_ns": gpu_t + 4_200})
            kernels.append((ENGINE_ATTENTION, 3_000))
            for name, dur in kernels:
                if eager:
                    corr += 1
                    ev.append(_x("cuda_runtime", "cudaLaunchKernel", pid, pid, host_t, 800,
                                 {"cbid": 211, "correlation": corr}))
                    host_t += 1_000
                ev.append(_x("kernel", name, 0, 7, gpu_t, dur, {
                    "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr,
                    "registers per thread": 32, "shared memory": 0, "grid": [2, 1, 1], "block": [128, 1, 1]}))
                gpu_t += dur + 200
        t += 200_000
    ev.append({"name": "process_name", "ph": "M", "ts": T0_US, "pid": pid, "tid": 0, "args": {"name": "python"}})
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
                              "computeMinor": 0, "numSms": 132}],
        "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS, "traceEvents": ev, "traceName": "synthetic-engine",
    }
    return doc, {"writes": writes}


# Today's Kineto category -> the name libkineto's ChromeTraceLogger wrote in 2020-2021 (torch 1.8-1.9)
LEGACY_CATEGORIES = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset", "cuda_runtime": "Runtime",
                     "cpu_op": "Operator"}


@dataclass(frozen=True)
class Vintage:
    """How an older Kineto wrote the same trace: each option one difference of its format."""

    categories: bool = True  # "Kernel", "Runtime", "Operator", "Memcpy", "Memset"
    flow_cat: str = "ac2g"  # the launch -> GPU flows' "cat": "async_gpu" (2022), "async" (2020)
    stream_tids: bool = False  # GPU rows on tid "stream <n>" (2020-2021) rather than the stream number
    bare_list: bool = False  # the file is the event list alone, no document around it (2020)


def vintage(doc: dict[str, Any], v: Vintage) -> Any:
    """A copy of ``doc`` (from build or build_engine) as a trace of that vintage writes it."""
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        cat = e.get("cat")
        if v.categories and cat in LEGACY_CATEGORIES:
            e["cat"] = LEGACY_CATEGORIES[cat]
        if cat == "ac2g":
            e["cat"] = v.flow_cat
        on_device = isinstance(e.get("pid"), int) and 0 <= e["pid"] < 64  # Kineto's GPU rows: pid = device
        if v.stream_tids and on_device and isinstance(e.get("tid"), int):
            e["tid"] = f"stream {e['tid']}"
        events.append(e)
    if v.bare_list:
        return events
    out = {k: val for k, val in doc.items() if k != "traceEvents"}
    out["traceEvents"] = events
    return out


@dataclass(frozen=True)
class NsysSpec:
    """An nsys SQLite export of a multi-GPU run, in one of the schemas nsys has written.

    Every device runs the same ``kernels`` kernels of ``dur_ns`` at the same times (the GPUs
    busy together); on one device, with ``streams`` > 1 and ``overlap_within``, kernel i of
    stream 1 starts ``dur_ns / 2`` after kernel i of stream 0 (half of each overlaps), else the
    streams take turns. ``device_table`` (None: no device table) holds each GPU's name under
    ``name_column`` (None: the table has no name column).
    """

    devices: int = 2
    streams: int = 2
    kernels: int = 4
    dur_ns: int = 1_000
    overlap_within: bool = False
    device_table: str | None = "TARGET_INFO_GPU"
    name_column: str | None = "name"
    device_name: str = "NVIDIA H100 80GB HBM3"


def build_nsys(path: Any, spec: NsysSpec) -> dict[str, Any]:
    """Write the export to ``path``; return the expected per-device figures."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        con.executescript("""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
                streamId INTEGER, correlationId INTEGER, globalPid INTEGER, shortName INTEGER, demangledName INTEGER);
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
                correlationId INTEGER, nameId INTEGER);
            INSERT INTO StringIds VALUES (1, 'gemm_kernel'), (2, 'cudaLaunchKernel');
        """)
        if spec.device_table is not None:
            name = f", [{spec.name_column}] TEXT" if spec.name_column else ""
            con.execute(f"CREATE TABLE [{spec.device_table}] (id INTEGER NOT NULL{name}, smCount INTEGER)")
            for d in range(spec.devices):
                values = (d, spec.device_name, 132) if spec.name_column else (d, 132)
                con.execute(f"INSERT INTO [{spec.device_table}] VALUES ({', '.join('?' * len(values))})", values)
        corr = 0
        expected: dict[str, Any] = {"devices": []}
        for d in range(spec.devices):
            pid = 100 + d  # one process per GPU, as a tensor-parallel engine runs
            gtid = (pid << 24) | pid
            for i in range(spec.kernels):
                for s in range(spec.streams):
                    corr += 1
                    if spec.overlap_within:
                        start = 1_000_000 + i * 4 * spec.dur_ns + s * (spec.dur_ns // 2)
                    else:
                        start = 1_000_000 + (i * spec.streams + s) * 2 * spec.dur_ns
                    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,1,1)",
                                (start, start + spec.dur_ns, d, 7 + s, corr, pid << 24))
                    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,2)",
                                (start - 5_000, start - 4_000, gtid, corr))
            per_i = (spec.dur_ns + (spec.streams - 1) * (spec.dur_ns // 2)) if spec.overlap_within else 0
            overlap = spec.kernels * (spec.dur_ns - spec.dur_ns // 2) if spec.overlap_within and spec.streams > 1 else 0
            busy = spec.kernels * per_i if spec.overlap_within else spec.kernels * spec.streams * spec.dur_ns
            expected["devices"].append({
                "device": d, "kernels": spec.kernels * spec.streams, "streams": spec.streams, "busy_ns": busy,
                "overlap_ns": overlap,
                "name": spec.device_name if spec.device_table is not None and spec.name_column else None})
        con.commit()
    finally:
        con.close()
    return expected
