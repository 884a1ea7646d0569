"""The SGLang plugin's sidecar (``kvprof-sglang.TP-<r>.pid-<p>.json``): typed, read in one place.

The plugin (``kvprof.integrations.sglang``) writes one per SGLang process that writes KV rows;
``kvprof analyze`` reads them beside SGLang's traces. ``Sidecar`` is the document; ``read_sidecar``
refuses a file that is not one, or is malformed, in one line (``TraceError``). Keys a newer plugin
adds are ignored by an older reader; keys an older plugin did not write read as their defaults
(``write_paths`` and ``graphs``: None, "not recorded").

``plugin_paths`` turns the plugin's counts into kvprof's write paths per variant
(``kvprof.core.vocab``), which is what the analysis judges a variant by:

- ``writer:<name>:<path>``: the named kvprof writer wrote, and reported ``<path>`` itself;
- ``sglang:fused_into_rope``: SGLang's rotary embedding stored K and V in its launch
  (variant ``sglang_fused_rope``), ``fused_into_rope``;
- ``sglang:<variant>``: SGLang's own ``set_kv_buffer`` path, as the plugin predicted it for
  the variant's pools (``native_path``): ``store_cache`` is one launch (``fused``),
  ``index_put`` two copies, its two-stream form two streams; anything else is not judged;
- ``sglang:fallback``: a call the named writer left to SGLang, one per reason in
  ``fallbacks``: the writer's ``fallback: <reason>``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

from kvprof.core.errors import TraceError
from kvprof.core.files import open_regular
from kvprof.core.vocab import FALLBACK_PREFIX, FUSED, ROPE_FUSED, TWO_COPIES, TWO_STREAMS

SIDECAR_SCHEMA = "kvprof.engine_sidecar/1"  # any engine's plugin (``engine`` names it)
SIDECAR_SCHEMA_PREFIX = "kvprof.engine_sidecar/"
SIDECAR_SCHEMA_PREFIXES = (SIDECAR_SCHEMA_PREFIX, "kvprof.sglang_sidecar/")  # and the SGLang plugin's before it
MAX_SIDECAR_BYTES = 64 << 20  # a process's pools, counts and graphs: kilobytes; more is not a sidecar

# The plugin's words, shared with the analysis that reads them back
ROPE_VARIANT = "sglang_fused_rope"  # the range variant of SGLang's own fused rope + store
PLUGIN_FALLBACK = "sglang:fallback"
NATIVE_STORE_CACHE = "store_cache"
NATIVE_INDEX_PUT = "index_put"
NATIVE_TWO_STREAMS = "index_put (two streams under graph capture)"
# SGLang's own paths, as the plugin names them, in kvprof's words (one launch or not)
NATIVE_PATHS = {NATIVE_STORE_CACHE: FUSED, NATIVE_INDEX_PUT: TWO_COPIES, NATIVE_TWO_STREAMS: TWO_STREAMS,
                ROPE_FUSED: ROPE_FUSED,
                # vLLM's ops (kvprof.integrations.vllm): each writes K and V in one launch
                "reshape_and_cache_flash": FUSED, "cpu_attn_reshape_and_cache": FUSED, "concat_and_cache_mla": FUSED,
                "rope_and_cache": ROPE_FUSED, "concat_and_cache_mla_rope_fused": ROPE_FUSED,
                # SGLang's bypass paths (kvprof.integrations.sglang.BYPASSES): one launch each
                "bf16_rope_scale_store": ROPE_FUSED, "fused_fp8_qkv_kv_cache": FUSED}
PLUGIN_SOURCE = "the SGLang plugin"
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}  # how an engine's name is written; others as given


def plugin_source(engines: list[str] | tuple[str, ...]) -> str:
    """"the SGLang plugin", "the vLLM plugin", "the SGLang and vLLM plugins": who counted the paths."""
    names = [ENGINE_NAMES.get(e, e) for e in engines] or ["SGLang"]
    return f"the {names[0]} plugin" if len(names) == 1 else f"the {' and '.join(names)} plugins"

# What is read is bounded where it is declared: a count is 0..2^53 (a JSON reader's exact integers;
# sums of many stay within what orjson writes), an id fits int64, a name is at most MAX_NAME characters
# (kvprof's and SGLang's names are tens of characters; a 200k-character one only slows every reader).
MAX_NAME = 1024
MAX_COUNT = 1 << 53
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Id = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
Text = Annotated[str, msgspec.Meta(max_length=16 * MAX_NAME)]  # a reason or an error message
# A kernel as the plugin names it: a C/C++ identifier, optionally qualified (``kvprof::store_kv_kernel``);
# how it is matched against a trace's kernel names: ``kernel_matches``
KERNEL_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*$"
KernelName = Annotated[str, msgspec.Meta(max_length=MAX_NAME, pattern=KERNEL_NAME_PATTERN)]


class SidecarPool(msgspec.Struct, kw_only=True):
    """One SGLang KV pool the plugin saw write: class, how it is hooked, its predicted path, shapes."""

    cls: Name | None = msgspec.field(default=None, name="class")
    hooked: Name | None = None
    variant: Name | None = None
    native_path: Name | None = None  # NATIVE_PATHS' keys, or quantized / layout:<x> / unknown (...)
    route: Name | None = None  # "writer:<name>" or "sglang" once a writer is named
    route_reason: Text | None = None
    rope_route: Name | None = None
    rope_route_reason: Text | None = None
    size: Count | None = None
    page_size: Count | None = None
    head_num: Count | None = None
    head_dim: Count | None = None
    v_head_dim: Count | None = None
    layer_num: Count | None = None
    start_layer: Count | None = None
    kv_lora_rank: Count | None = None
    qk_rope_head_dim: Count | None = None
    kv_cache_layout: Name | None = None
    dtype: Name | None = None
    store_dtype: Name | None = None
    device: Name | None = None
    quantized: bool | None = None


class SidecarDevice(msgspec.Struct, kw_only=True):
    """The process's CUDA device (``kvprof.kvcache.devinfo.device_properties``), its peak and where that came from."""

    type: Name | None = None
    index: Count | None = None
    name: Name | None = None
    capability: Name | None = None
    sm_count: Count | None = None
    total_memory_bytes: Count | None = None
    peak_bandwidth_gbs: float | None = None
    peak_bandwidth_source: Name | None = None  # kvprof.core.devices: "spec table", "device properties"
    peak_bandwidth_datasheet_gbs: float | None = None
    peak_bandwidth_computed_gbs: float | None = None
    memory_clock_khz: Count | None = None
    memory_bus_width_bits: Count | None = None

    def to_dict(self) -> dict[str, object]:
        return msgspec.structs.asdict(self)


class GraphWrite(msgspec.Struct, kw_only=True):
    """One write recorded into a CUDA graph while it was captured, in capture order."""

    layer: Annotated[int, msgspec.Meta(ge=-1, le=MAX_COUNT)]  # -1: a write whose layer could not be named
    variant: Name  # the range variant its eager twin gets
    path: Name  # the plugin's path key (sglang:<variant>, writer:<name>:<path>, ...)
    tokens: Count  # read as >= 0; -1 only where kvprof itself says the count is unknown
    kernel: KernelName | None = None  # its kernel's name, where the plugin knows it (``kernel_matches``)
    kernels: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] = 1  # kernels one such write launches
    # (SGLang's index_put path: 2)


class CapturedGraph(msgspec.Struct, kw_only=True):
    """A CUDA graph captured while the plugin was on, and the writes captured into it.

    ``graph`` is the number the plugin gave it; each replay of it runs inside a host range
    ``kvprof.graph_replay[<graph>]`` (``kvprof.core.vocab.GRAPH_REPLAY_RANGE_FORMAT``)."""

    graph: Id
    writes: list[GraphWrite] = []


class SidecarLedger(msgspec.Struct, kw_only=True):
    """The write ledger: over ``steps`` forward steps, the tokens the engine was asked to write per
    layer (the batch's tokens times each layer that keeps a cache) against the tokens a hooked
    write carried; layers are keys as text (JSON), -1 a write without a layer. ``graph_steps``:
    steps replayed from a CUDA graph (their writes run inside the replay, no hook is called:
    not expected of the hooks). ``unseen_paths``: writes the plugin knows took a path without a
    range, by the path's name."""

    steps: Count = 0
    graph_steps: Count = 0
    expected: dict[str, Count] = {}
    seen: dict[str, Count] = {}
    unseen_paths: dict[str, Count] = {}


class ShadowMismatch(msgspec.Struct, kw_only=True):
    """A sampled write whose rows the shadow check found different from its inputs."""

    layer: Annotated[int, msgspec.Meta(ge=-1, le=MAX_COUNT)]  # -1: a write whose layer could not be named
    variant: Name
    slot: Annotated[int, msgspec.Meta(ge=-1, le=MAX_COUNT)]  # the first token's slot whose row differs
    rows: Count  # the write's tokens whose row differs


class SidecarShadow(msgspec.Struct, kw_only=True):
    """The plugin's sampled shadow check (``KVPROF_<ENGINE>_SHADOW=N``): of ``writes`` hooked writes,
    every ``every``-th (``sampled``) had its rows compared, right after it, with the inputs it was
    given: ``checked`` compared, ``mismatched`` with a row that differs (the first few named),
    ``skipped`` by reason (a write it cannot check, a CUDA graph capture)."""

    every: Count
    writes: Count = 0
    sampled: Count = 0
    checked: Count = 0
    mismatched: Count = 0
    rows_checked: Count = 0
    rows_mismatched: Count = 0
    skipped: dict[Text, Count] = {}
    first_mismatches: list[ShadowMismatch] = []
    # inside CUDA graphs: captured writes given a comparison kernel (``in_graphs``), and the checks
    # their replays made (``replayed``, counted in ``checked`` and the rows above)
    in_graphs: Count = 0
    replayed: Count = 0


class SidecarCanary(msgspec.Struct, kw_only=True):
    """SGLang's own KV canary (``--kv-canary log|raise``) as the plugin read it: the violations
    SGLang reported in this process (each one line of SGLang's, ``kv_canary violation: ...``),
    counted by fail reason, the first few kept; ``total``: SGLang's own count (its ring may overflow)."""

    violations: Count = 0
    total: Count = 0
    by_reason: dict[Name, Count] = {}
    first: list[Text] = []


class Sidecar(msgspec.Struct, kw_only=True):
    """One engine process's record of its KV writes (see docs/engines.md, "The sidecar")."""

    schema: Name
    engine: Name = "sglang"  # sglang, vllm; a sidecar from before engines were named: SGLang's
    engine_version: Name | None = None
    kvprof_version: Name | None = None
    sglang_version: Name | None = None
    pid: Id | None = None
    rank: Count | None = None
    tp_rank: Count | None = None
    tp_size: Count | None = None
    hooked: list[Name] = []
    writer: Name | None = None
    writer_error: Text | None = None
    pools: list[SidecarPool] = []
    paths: dict[Name, Count] = {}
    write_paths: dict[Name, Count] | None = None  # None: a sidecar from before the plugin counted them
    fallbacks: dict[Text, Count] = {}
    unattributed: dict[Text, Count] = {}
    device: SidecarDevice | None = None
    graphs: list[CapturedGraph] | None = None  # None: a plugin that did not record graph captures
    graphs_without_writes: Count = 0
    graph_hook: Text | None = None  # where the plugin noted graph captures, or why it could not
    ledger: SidecarLedger | None = None  # None: a plugin that kept no ledger
    shadow: SidecarShadow | None = None  # None: the shadow check was off
    canary: SidecarCanary | None = None  # None: SGLang's canary reported nothing (or is not hooked)
    file: Name | None = None  # the file's name, set by read_sidecar (not written by the plugin)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


def shadow_lines(sidecar: Sidecar) -> tuple[bool, list[str]]:
    """(a row mismatched, the lines that say so) for one sidecar's shadow check; no lines where it was off."""
    sh = sidecar.shadow
    if sh is None:
        return False, []
    who = f"{ENGINE_NAMES.get(sidecar.engine, sidecar.engine)} TP {sidecar.tp_rank} pid {sidecar.pid}"
    skipped = sum(sh.skipped.values())
    graphs = (f"; {sh.replayed:,} in replays of {sh.in_graphs:,} captured writes" if sh.in_graphs else "")
    head = (f"shadow check ({who}, 1 write in {sh.every} of {sh.writes:,}): {sh.checked:,} writes checked "
            f"({sh.rows_checked:,} rows{graphs}), {sh.mismatched:,} mismatched, {skipped:,} skipped")
    if sh.mismatched:
        lines = [f"{head}: KV ROWS DIFFER FROM THE WRITE'S INPUTS in {sh.mismatched:,} writes "
                 f"({sh.rows_mismatched:,} rows); first: " +
                 "; ".join(f"{m.variant} L{m.layer} slot {m.slot} ({m.rows} rows)" for m in sh.first_mismatches)]
    else:
        lines = [head + ("" if sh.checked else ": nothing was compared, so nothing is shown right")]
    lines += [f"  skipped {n:,}: {reason}" for reason, n in sorted(sh.skipped.items(), key=lambda x: -x[1])]
    return bool(sh.mismatched), lines


def canary_lines(sidecar: Sidecar) -> list[str]:
    """SGLang's canary violations as the plugin read them (none: no lines)."""
    c = sidecar.canary
    if c is None or not c.violations:
        return []
    who = f"{ENGINE_NAMES.get(sidecar.engine, sidecar.engine)} TP {sidecar.tp_rank} pid {sidecar.pid}"
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(c.by_reason.items()))
    return [f"SGLang's KV canary ({who}): {c.violations:,} VIOLATIONS reported (SGLang's count {c.total:,}; "
            f"{reasons})", *(f"  {line}" for line in c.first)]


def encode_sidecar(sidecar: Sidecar) -> bytes:
    """The sidecar as the plugin writes it (indented JSON, without ``file``)."""
    doc = sidecar.to_json()
    doc.pop("file", None)
    return msgspec.json.format(msgspec.json.encode(doc), indent=2)


def decode_sidecar(raw: bytes, name: str) -> Sidecar:
    """``raw`` as a sidecar, or a one-line TraceError naming ``name`` and what is wrong."""
    try:
        doc = msgspec.json.decode(raw, type=Sidecar)
    except RecursionError:
        raise TraceError(f"{name}: not a kvprof engine sidecar (nested deeper than a reader can follow)") from None
    except msgspec.ValidationError as exc:
        schema = _schema_of(raw)
        if schema is not None and not schema.startswith(SIDECAR_SCHEMA_PREFIXES):
            raise TraceError(f"{name}: not a kvprof engine sidecar (schema {schema[:80]!r})") from None
        raise TraceError(f"{name}: malformed kvprof engine sidecar ({_one_line(exc)})") from None
    except msgspec.DecodeError as exc:
        raise TraceError(f"{name}: not a kvprof engine sidecar (not JSON: {_one_line(exc)})") from None
    if not doc.schema.startswith(SIDECAR_SCHEMA_PREFIXES):
        raise TraceError(f"{name}: not a kvprof engine sidecar (schema {doc.schema[:80]!r}, expected "
                         f"{SIDECAR_SCHEMA_PREFIX}...)")
    key = f"{doc.engine}:fallback"  # each engine's plugin counts its own (vLLM's: vllm:fallback)
    fell_back = doc.paths.get(key, 0)
    if sum(doc.fallbacks.values()) > fell_back:
        raise TraceError(f"{name}: malformed kvprof engine sidecar ({sum(doc.fallbacks.values()):,} fallbacks by "
                         f"reason, but {key} counts {fell_back:,})")
    return msgspec.structs.replace(doc, file=name)


def check_one_per_process(sidecars: list[Sidecar]) -> None:
    """Refuse two sidecars that name one process (pid): which one's record a replay of that
    process follows could not be told, and counting both would count its writes twice."""
    seen: dict[int, str] = {}
    for sc in sidecars:
        if sc.pid is None:
            continue
        if sc.pid in seen:
            raise TraceError(f"two kvprof engine sidecars name process {sc.pid} ({seen[sc.pid]}, {sc.file}): "
                             "a process writes one; keep the one of this run and move the other away")
        seen[sc.pid] = sc.file or "?"


_IDENT = re.compile(r"[A-Za-z0-9_]+(?:::[A-Za-z0-9_]+)*")


def kernel_matches(kernel_name: str, recorded: Collection[str]) -> set[str]:
    """The recorded kernel names (``GraphWrite.kernel``) that a trace's kernel name is a kernel of.

    The rule: take the qualified identifiers of the trace's name (``void sglang::store_kvcache_kernel<256l,
    ...>(sglang::StoreKVCacheParams)`` holds ``sglang::store_kvcache_kernel``, ``sglang::StoreKVCacheParams``,
    ...) and each of their ``::`` tails (``store_kvcache_kernel``); a recorded name matches when it is one
    of these, or one of these is the recorded name followed by ``_`` and more (a Triton specialisation
    suffix, ``index_put`` in ``index_put_kernel_impl``). Never a part of a word: ``gemm`` is not a kernel
    of ``sm90_xmma_gemm_bf16bf16``. Linear in the name (times the recorded names' ``::`` depth): a
    dictionary look-up per ``_`` of each identifier.
    """
    out: set[str] = set()
    if not recorded:
        return out
    depth = max(r.count("::") for r in recorded) + 1  # the longest tail worth looking up
    longest = max(len(r) for r in recorded)  # and the longest prefix
    for m in _IDENT.finditer(kernel_name):
        parts = m.group().split("::")
        for i in range(max(0, len(parts) - depth), len(parts)):
            ident = "::".join(parts[i:])
            if ident in recorded:
                out.add(ident)
            cut = ident.find("_", len(ident) - len(parts[-1]) + 1)
            while 0 < cut <= longest:
                if ident[:cut] in recorded:
                    out.add(ident[:cut])
                cut = ident.find("_", cut + 1)
    return out


def read_sidecar(path: Path) -> Sidecar:
    """The sidecar at ``path``; a file that cannot be read, is not one or is malformed: a one-line TraceError."""
    try:
        with open_regular(path) as f:
            raw = f.read(MAX_SIDECAR_BYTES + 1)
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read the kvprof engine sidecar ({exc.strerror or exc})") from None
    if len(raw) > MAX_SIDECAR_BYTES:
        raise TraceError(f"{path.name}: not a kvprof engine sidecar (larger than {MAX_SIDECAR_BYTES >> 20} MiB)")
    return decode_sidecar(raw, path.name)


def _schema_of(raw: bytes) -> str | None:
    class _Head(msgspec.Struct):
        schema: object = None

    try:
        head = msgspec.json.decode(raw, type=_Head)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return head.schema if isinstance(head.schema, str) else None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


@dataclass
class PluginPaths:
    """One variant's writes as the plugin counted them, in kvprof's path words."""

    paths: dict[str, int] = field(default_factory=dict)  # kvprof.core.vocab paths -> writes
    counted: dict[str, int] = field(default_factory=dict)  # the plugin's own keys -> writes
    undecided: list[str] = field(default_factory=list)  # counts the paths could not be judged by, and why
    files: list[str] = field(default_factory=list)  # the sidecars they came from
    engines: list[str] = field(default_factory=list)  # the engines whose plugins counted them

    @property
    def source(self) -> str:
        return plugin_source(self.engines)

    def add(self, path: str, n: int) -> None:
        self.paths[path] = self.paths.get(path, 0) + n


def native_variant_path(sidecar: Sidecar, variant: str) -> tuple[str | None, str | None]:
    """(kvprof's path for SGLang's own writes of ``variant`` in this process, None) or (None, why not)."""
    natives: list[str] = sorted({p.native_path or "unknown" for p in sidecar.pools
                                 if p.variant == variant and p.native_path != ROPE_FUSED})
    if not natives:
        return None, f"no pool of {variant} described"
    if len(natives) > 1:
        return None, f"its pools take different paths ({', '.join(natives)})"
    path = NATIVE_PATHS.get(natives[0])
    return (path, None) if path else (None, f"SGLang's path {natives[0]!r} is not one kvprof judges")


def plugin_paths(sidecars: list[Sidecar]) -> dict[str, PluginPaths]:
    """Per variant, the paths its writes took as the plugin counted them (see the module's doc)."""
    out: dict[str, PluginPaths] = {}

    def of(variant: str, sidecar: Sidecar) -> PluginPaths:
        pp = out.setdefault(variant, PluginPaths())
        if sidecar.file and sidecar.file not in pp.files:
            pp.files.append(sidecar.file)
        if sidecar.engine not in pp.engines:
            pp.engines.append(sidecar.engine)
        return pp

    for sc in sidecars:
        engine = f"{sc.engine}:"
        for key, n in sc.paths.items():
            if not n:
                continue
            if key.startswith("writer:"):
                _, name, path = (key.split(":", 2) + ["", ""])[:3]
                if name and path:
                    pp = of(name, sc)
                    pp.add(path, n)
                    pp.counted[key] = pp.counted.get(key, 0) + n
                continue
            if key == f"{engine}fallback":
                if sc.writer:
                    pp = of(sc.writer, sc)
                    pp.counted[key] = pp.counted.get(key, 0) + n
                    for reason, m in (sc.fallbacks or {"unknown reason": n}).items():
                        pp.add(f"{FALLBACK_PREFIX} {reason}", m)
                continue
            if not key.startswith(engine):
                continue
            native = key[len(engine):]
            if native == ROPE_FUSED:
                pp = of(ROPE_VARIANT, sc)
                pp.add(ROPE_FUSED, n)
            else:
                pp = of(native, sc)
                judged, why = native_variant_path(sc, native)
                if judged is not None:
                    pp.add(judged, n)
                else:
                    pp.undecided.append(f"{key} x{n}: {why}")
            pp.counted[key] = pp.counted.get(key, 0) + n
    return out
