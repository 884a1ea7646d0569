#!/usr/bin/env python3
"""The compiled facts behind the fused writers' timings; run once on the H200 (< 90 s).

    cd <repo> && OUT=/tmp/out python lab/kernel_facts.py    # JSON to $OUT/kernel-facts.json

The ncu and disassembly facts that explain the bench's numbers (bytes per access, registers,
achieved bandwidth): tune_fused.py gives the times, this script the why.
1. triton: writes with the config TritonFusedWriter picks itself (1x128, 8x128, 32x128;
   bf16 and fp8 e4m3 from bf16, scale 0.5; 1/512/4096 tokens), and of each compiled
   ``store_kv_kernel``: registers, spills, shared memory, warps, the grid, the SASS global
   loads/stores by width (bytes per access per thread), PDL and the packed fp8 cast in the PTX.
2. cuda: the CUDA op's .so (cuobjdump): registers and LDG/STG widths per kernel
   instantiation, and ptxas' "Used N registers" lines from its build.log; and the same for
   sgl-kernel's store kernels in the cubin sgl_kernel_cubin runs (with whether they use PDL).
3. ncu: Nsight Compute on a child run of this script (``--ncu-child``, eager writes):
   duration, DRAM and L2 bytes, throughputs; DRAM bandwidth = (read + write) / duration.
   Needs the GPU performance counters; without them ncu's one-line reason is recorded.
Each section records its own error and never stops the others. Most of the time goes to
Triton compiles (~10 variants) and, unless the CUDA op is built already, its build.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the compiled kernels, whatever the shell says
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kvprof.core.atomic import atomic_write_text  # noqa: E402  (after the path insert)

T0 = time.perf_counter()
DTYPES = [("bf16", torch.bfloat16, None), ("fp8", torch.float8_e4m3fn, 0.5)]  # the input is bf16
NCU_METRICS = ("gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,"
               "sm__throughput.avg.pct_of_peak_sustained_elapsed,"
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,"
               "launch__registers_per_thread,launch__grid_size,launch__block_size")
WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16, "256": 32}  # else 4 bytes
MEM_OP = re.compile(r"(?<![\w.])(LDG|STG|LD|ST)((?:\.\w+)*)\s")  # global and generic loads/stores
UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "nsecond": 1e-9, "usecond": 1e-6,
         "msecond": 1e-3, "second": 1, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1,
         "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9}  # ncu's units (decimal bytes) -> bytes and seconds
# With --print-units base ncu prints times in nanoseconds; an unrecognised time unit is read so.
TIME_UNIT_DEFAULT = 1e-9


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:5.1f}s] {msg}", flush=True)


def oneline(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def sh(*cmd: str, timeout: float = 60, stdin: str | None = None) -> str:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, check=True).stdout


def tool(name: str) -> str | None:
    """A CUDA binary: $CUDA_HOME, torch's CUDA_HOME, /usr/local/cuda, PATH, then Triton's bundled one."""
    from torch.utils.cpp_extension import CUDA_HOME
    for base in (os.environ.get("CUDA_HOME"), CUDA_HOME, "/usr/local/cuda"):
        if base and (Path(base) / "bin" / name).exists():
            return str(Path(base) / "bin" / name)
    if shutil.which(name):
        return shutil.which(name)
    import triton
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(bundled) if bundled.exists() else None


def mem_ops(sass: str) -> dict:
    """SASS -> global/generic load and store opcode counts, counts by access width in bytes, and
    bytes per thread (straight-line code: each instruction runs once per thread)."""
    ops = Counter(m.group(1) + m.group(2) for line in sass.splitlines() if "/*" in line
                  for m in [MEM_OP.search(line.split(";")[0])] if m)
    out: dict = {"ops": dict(sorted(ops.items())), "ld_widths": {}, "st_widths": {}}
    for op, n in ops.items():
        side = out["ld_widths" if op.startswith("LD") else "st_widths"]
        width = next((WIDTH[t] for t in op.split(".")[1:] if t in WIDTH), 4)
        side[width] = side.get(width, 0) + n
    for side in ("ld", "st"):
        out[f"{side}_bytes_per_thread"] = sum(w * n for w, n in out[f"{side}_widths"].items())
    return out


def widths(d: dict) -> str:
    return " ".join(f"{w}Bx{n}" for w, n in sorted(d.items(), key=lambda wn: -int(wn[0]))) or "-"


def disassemble(cubin: bytes) -> tuple[str, str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        err = "neither cuobjdump nor nvdisasm found"
        for name, flag in (("cuobjdump", "-sass"), ("nvdisasm", "-c")):
            if path := tool(name):
                try:
                    return sh(path, flag, f.name), path
                except Exception as exc:  # try the next tool
                    err = oneline(exc)
    raise RuntimeError(err)


# -- 1. Triton ---------------------------------------------------------------------------------------
class Spy:
    """Stands in for ``triton_kernel.store_kv_kernel``: keeps each launch's grid, keywords and CompiledKernel."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        def call(*args, **kw):
            kernel = self.fn[grid](*args, **kw)  # JITFunction.run returns the CompiledKernel
            self.calls.append((grid, kw, kernel))
            return kernel
        return call


def from_jit_cache(fn):
    """Newest CompiledKernel in Triton's cache (3.4+: device_caches[dev] = (kernels, keys, target, ...))."""
    entry = fn.device_caches[torch.cuda.current_device()]
    found = [k for k in (entry[0] if isinstance(entry, tuple) else entry).values() if hasattr(k, "asm")]
    return found[-1] if found else None


def kernel_facts(ck) -> dict:
    md, ptx = ck.metadata, ck.asm.get("ptx", "")
    f = dict(name=ck.name, n_regs=getattr(ck, "n_regs", None), n_spills=getattr(ck, "n_spills", None),
             shared=getattr(md, "shared", None), num_warps=getattr(md, "num_warps", None),
             ptx_griddepcontrol="griddepcontrol" in ptx, ptx_cvt_e4m3x2="cvt.rn.satfinite.e4m3x2" in ptx)
    try:
        sass, f["disassembler"] = disassemble(ck.asm["cubin"])
        f.update(mem_ops(sass))
    except Exception as exc:
        f["sass_error"] = oneline(exc)
    return f


def triton_point(tf, spy, heads: int, dim: int, cache, scale, tokens: int, kernels: dict) -> dict:
    from kvprof.kvcache.dtypes import store_dtype_for
    slots = 2 * tokens + 17
    k_buf = torch.zeros(slots, heads, dim, dtype=store_dtype_for(cache), device="cuda")
    v_buf = torch.zeros_like(k_buf)
    loc = torch.randperm(slots - 1, device="cuda")[:tokens] + 1  # int64
    k = torch.randn(tokens, heads, dim, device="cuda").to(torch.bfloat16)
    v = torch.randn(tokens, heads, dim, device="cuda").to(torch.bfloat16)
    # what the writer picks: K+V input bytes per token, and which table (fp8 caches have their own)
    cfg = tf.pick_config(2 * heads * dim * 2, tokens, fp8=cache.itemsize == 1)
    spy.calls.clear()
    tf.TritonFusedWriter(config=cfg, pdl=True).write(k_buf, v_buf, loc, k, v, cache, scale, scale)
    torch.cuda.synchronize()
    grid, kw, ck = spy.calls[-1]
    ck = ck if hasattr(ck, "asm") else from_jit_cache(spy.fn)
    mode, split, bt = kw.get("MODE", 0), kw.get("SPLIT", 1), kw.get("BLOCK_T", cfg.block_t)
    key = getattr(ck, "hash", None) or str(id(ck))
    if key not in kernels:
        kernels[key] = kernel_facts(ck)
    p = dict(config=dict(block_t=cfg.block_t, num_warps=cfg.num_warps, split=getattr(cfg, "split", 1)),
             grid=list(grid) if isinstance(grid, (tuple, list)) else repr(grid), launch_split=split, mode=mode,
             fp8_int=bool(mode >> 12 & 1), wide=bool(mode >> 10 & 1), pdl=bool(mode >> 11 & 1),
             kernel=key[:12], **kernels[key])
    threads = 32 * (p["num_warps"] or cfg.num_warps)
    row = 2 * heads * dim  # K + V elements per token
    p["prog_bytes"] = dict(ld_sass=p.get("ld_bytes_per_thread", 0) * threads, ld_needed=bt * (row * 2 // split + 8),
                           st_sass=p.get("st_bytes_per_thread", 0) * threads,
                           st_needed=bt * row * k_buf.element_size() // split)
    return p


def triton_facts() -> dict:
    import kvprof.kvcache.writers.triton_fused as tf
    import kvprof.kvcache.writers.triton_kernel as tk
    spy, kernels, points = Spy(tk.store_kv_kernel), {}, []
    tk.store_kv_kernel = spy  # write() looks the kernel up at call time
    os.environ["KVPROF_TRITON_LAUNCHER"] = "0"  # every launch through the spy's JIT call, none kept
    try:
        for heads, dim in [(1, 128), (8, 128), (32, 128)]:
            for dname, cache, scale in DTYPES:
                for tokens in (1, 512, 4096):
                    p = dict(shape=f"{heads}x{dim}", dtype=dname, tokens=tokens)
                    try:
                        p.update(triton_point(tf, spy, heads, dim, cache, scale, tokens, kernels))
                    except Exception as exc:
                        p["error"] = oneline(exc)
                    points.append(p)
    finally:
        tk.store_kv_kernel = spy.fn
    return dict(points=points)


# -- 2. CUDA op -------------------------------------------------------------------------------------
def parse_cuobjdump(usage: str, sass: str, build_log: str) -> dict:
    """Per kernel (mangled name): {arch: resource usage}, "sass": mem_ops, "ptxas": {arch: line}."""
    kernels: dict = {}
    arch, fn = "?", "?"
    for line in usage.splitlines():
        if m := re.search(r"arch = (sm_\w+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function (\S+?):?$", line):
            fn = m.group(1)
        elif m := re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line):
            kernels.setdefault(fn, {})[arch] = dict(zip(("regs", "stack", "shared", "local"), map(int, m.groups())))
    for part in re.split(r"\n(?=\s*Function : )", sass):
        if m := re.match(r"\s*Function : (\S+)", part):
            kernels.setdefault(m.group(1), {}).setdefault("sass", mem_ops(part))
    ran = [s for s in build_log.split("===== build at") if "Used " in s]  # the last build that ran ptxas
    entry = None
    for line in (ran[-1] if ran else "").splitlines():
        if m := re.search(r"entry function '(\S+)' for '(\w+)'", line):
            entry = m.groups()
        elif "Used " in line and entry:
            kernels.setdefault(entry[0], {}).setdefault("ptxas", {})[entry[1]] = line.split(":", 1)[-1].strip()
    return kernels


def demangle(names: list[str]) -> list[str]:
    """store_kv_kernel<CopyOp<uint4>> for _ZN6kvprof15store_kv_kernel...; the mangled names without a filter."""
    filt = tool("cu++filt") or shutil.which("c++filt")
    try:
        out = sh(filt, stdin="\n".join(names) + "\n").splitlines() if filt else []
    except Exception:
        out = []
    return [re.sub(r"^void |kvprof::|\(.*\)$|(?<=[,>]) ", "", d) for d in out] if len(out) == len(names) else names


def cuda_facts() -> dict:
    from kvprof.kvcache.writers.cuda_fused import build_dir, load_extension
    t = time.perf_counter()
    _, err = load_extension()  # builds into build_dir() unless built already
    out: dict = dict(build_dir=str(build_dir()), load_s=round(time.perf_counter() - t, 1), load_error=err)
    sos, cuobjdump = sorted(build_dir().glob("*.so")), tool("cuobjdump")
    if not sos or not cuobjdump:
        return dict(out, error=f"no .so in {build_dir()}" if not sos else "no cuobjdump found")
    log_path = build_dir() / "build.log"
    kernels = parse_cuobjdump(sh(cuobjdump, "--dump-resource-usage", str(sos[0])), sh(cuobjdump, "-sass", str(sos[0])),
                              log_path.read_text(errors="replace") if log_path.exists() else "")
    return dict(out, so=str(sos[0]), cuobjdump=cuobjdump, kernels=dict(zip(demangle(list(kernels)), kernels.values())))


# -- 2b. sgl-kernel's store kernels (the bench's peer) --------------------------------------------
def sgl_facts() -> dict:
    """Registers, access widths and PDL of sgl-kernel's store_kv_cache kernels, from the cubin
    the sgl_kernel_cubin variant runs (KVPROF_SGL_CUBIN): why the peer sits where it does."""
    path, cuobjdump = os.environ.get("KVPROF_SGL_CUBIN"), tool("cuobjdump")
    if not path or not Path(path).is_file():
        return dict(error="KVPROF_SGL_CUBIN is not set to a cubin (python -m kvprof.kvcache.writers.sgl_cubin_extract)")
    if not cuobjdump:
        return dict(error="no cuobjdump found")
    sass = sh(cuobjdump, "-sass", path)
    kernels = parse_cuobjdump(sh(cuobjdump, "--dump-resource-usage", path), sass, "")
    for part in re.split(r"\n(?=\s*Function : )", sass):
        if m := re.match(r"\s*Function : (\S+)", part):
            kernels[m.group(1)]["pdl"] = "ACQBULK" in part or "griddepcontrol" in part
    meta = Path(path).with_suffix(".json")
    def short(name: str) -> str:  # store_kv_cache_256x1<int64> (c++filt folds the anonymous namespace away)
        m = re.search(r"store_kv_cache_(\w+?)I([il])E", name)
        return f"store_kv_cache_{m.group(1)}<{'int32' if m.group(2) == 'i' else 'int64'}>" if m else name

    for k in kernels.values():  # a bare cubin's usage names no arch: it is the sm_90 one
        if "?" in k:
            k["sm_90"] = k.pop("?")
    return dict(cubin=path, meta=json.loads(meta.read_text()) if meta.is_file() else {},
                kernels={short(n): k for n, k in sorted(kernels.items())})


# -- 3. Nsight Compute ---------------------------------------------------------------------------
def ncu_child(manifest: str) -> None:
    """Eager writes for ncu to profile, 2 per point; what was launched, in order, goes to ``manifest``."""
    from kvprof.kvcache.dtypes import store_dtype_for
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter, pick_config
    labels = []
    for heads in (1, 8):
        for dname, cache, scale in DTYPES:
            for tokens in (4096, 32768):
                k_buf = torch.zeros(4 * tokens, heads, 128, dtype=store_dtype_for(cache), device="cuda")
                v_buf = torch.zeros_like(k_buf)
                loc = torch.randperm(4 * tokens, device="cuda")[:tokens]
                k = torch.randn(tokens, heads, 128, device="cuda").to(torch.bfloat16)
                v = torch.randn(tokens, heads, 128, device="cuda").to(torch.bfloat16)
                cfg = pick_config(2 * heads * 128 * 2, tokens, fp8=cache.itemsize == 1)
                needed = tokens * (8 + 2 * heads * 128 * (2 + k_buf.element_size()))  # slots, rows in, rows out
                for _ in range(2):
                    TritonFusedWriter(config=cfg, pdl=True).write(k_buf, v_buf, loc, k, v, cache, scale, scale)
                    labels.append(dict(label=f"{heads}x128 {dname} {tokens}", config=repr(cfg), needed_bytes=needed))
    torch.cuda.synchronize()
    Path(manifest).write_text(json.dumps(labels))


def parse_ncu_csv(stdout: str) -> list[dict]:
    """ncu --csv (one row per kernel and metric) -> one dict per kernel, in profiling order."""
    rows = list(csv.reader(ln for ln in stdout.splitlines() if ln.startswith('"')))
    if not rows or "Metric Name" not in rows[0]:
        return []
    col = {name: i for i, name in enumerate(rows[0])}
    by_id: dict = {}
    for row in rows[1:]:
        k = by_id.setdefault(int(row[col["ID"]]), dict(kernel=row[col["Kernel Name"]], grid=row[col["Grid Size"]],
                                                      block=row[col["Block Size"]]))
        raw = row[col["Metric Value"]].replace(",", "")
        name, unit = row[col["Metric Name"]], row[col["Metric Unit"]].lower()
        default = TIME_UNIT_DEFAULT if "time_duration" in name else 1
        try:
            k[name] = float(raw) * UNITS.get(unit, default)
        except ValueError:
            k[row[col["Metric Name"]]] = raw
    return [by_id[i] for i in sorted(by_id)]


def ncu_facts() -> dict:
    cands = [shutil.which("ncu"), *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True),
             *(f"{b}/bin/ncu" for b in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if b)]
    ncu = next((c for c in cands if c and Path(c).exists()), None)
    if not ncu:
        return dict(error="ncu not found (PATH, /opt/nvidia/nsight-compute/*/ncu, $CUDA_HOME/bin)")
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "manifest.json"
        cmd = [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "-k", "regex:store_kv",
               "--metrics", NCU_METRICS, sys.executable, str(Path(__file__).resolve()), "--ncu-child", str(manifest)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # ncu and the Python run it profiles
            proc.communicate()
            return dict(ncu=ncu, error="ncu timed out after 120 s")
        labels = json.loads(manifest.read_text()) if manifest.exists() else []
    out: dict = dict(ncu=ncu, rc=proc.returncode, clock_control="none", kernels=parse_ncu_csv(stdout))
    text = stdout + "\n" + stderr
    errors = [ln.strip() for ln in text.splitlines() if "==ERROR==" in ln or "ERR_NVGPUCTRPERM" in ln]
    if errors or not out["kernels"]:
        out["error"] = (errors or [f"no ncu CSV (rc {proc.returncode}): {text.strip()[-300:]}"])[0][:300]
    if len(labels) != len(out["kernels"]):
        out["note"] = f"{len(out['kernels'])} kernels profiled, {len(labels)} launched: no labels"
        labels = [{}] * len(out["kernels"])
    for k, lab in zip(out["kernels"], labels):
        k.update(lab)
        dur, rd, wr, l2 = (k.get(m) for m in ("gpu__time_duration.sum", "dram__bytes_read.sum",
                                              "dram__bytes_write.sum", "lts__t_bytes.sum"))
        if all(isinstance(x, float) for x in (dur, rd, wr)) and dur > 0:
            k["dram_GBps"] = round((rd + wr) / dur / 1e9, 1)
            k["l2_GBps"] = round(l2 / dur / 1e9, 1) if isinstance(l2, float) else None
    return out


# -- summary ---------------------------------------------------------------------------------------
def summary(doc: dict) -> None:
    sec = doc["sections"]
    print(f"\n{doc['device']}  torch {doc['torch']}  triton {doc['triton']}")
    print("\n1. triton _store_kv_kernel, bf16 input (widths: bytes per access per thread x instructions; "
          "prog B: per program, from the SASS / needed)")
    print(f"{'shape':>6} {'dtype':>4} {'tok':>5} {'bt,w,s':>7} {'grid':>10} {'regs':>4} {'spill':>5} {'smem':>5} "
          f"{'LDG':>17} {'STG':>17} {'ld prog B':>11} {'st prog B':>11} gdc e4m3x2 fp8int")
    yn = {True: "y", False: "n", None: "?"}
    if sec["triton"].get("error"):
        print(f"   ERROR {sec['triton']['error']}")
    for p in sec["triton"].get("points", []):
        head = f"{p['shape']:>6} {p['dtype']:>4} {p['tokens']:>5}"
        if "error" in p:
            print(f"{head}  ERROR {p['error']}")
            continue
        c, b = p["config"], p["prog_bytes"]
        print(f"{head} {c['block_t']:>3},{c['num_warps']},{p['launch_split']} {str(p['grid']):>10} {p['n_regs']!s:>4} "
              f"{p['n_spills']!s:>5} {p['shared']!s:>5} {widths(p.get('ld_widths', {})):>17} "
              f"{widths(p.get('st_widths', {})):>17} {b['ld_sass']:>5}/{b['ld_needed']:<5} "
              f"{b['st_sass']:>5}/{b['st_needed']:<5} {yn[p['ptx_griddepcontrol']]:>3} {yn[p['ptx_cvt_e4m3x2']]:>6} "
              f"{yn[p['fp8_int']]:>6} {p.get('sass_error', '')}")
    cu = sec["cuda"]
    print(f"\n2. cuda_fused op {cu.get('so', '')} (load {cu.get('load_s', '-')} s): copies and bf16 -> e4m3 "
          f"(ConvertOp<IN=1,OUT=3,N,hw_fp8>) here, every instantiation in the JSON")
    if cu.get("error") or cu.get("load_error"):
        print(f"   ERROR {cu.get('error') or cu.get('load_error')}")
    for name, k in cu.get("kernels", {}).items():
        if "CopyOp" in name or "ConvertOp<1,3," in name:
            regs = " ".join(f"{a}:{v['regs']}" for a, v in k.items() if a.startswith("sm_"))
            s = k.get("sass", {})
            print(f"   {name:<40} regs {regs:<9} LDG {widths(s.get('ld_widths', {})):<18} "
                  f"STG {widths(s.get('st_widths', {})):<18} ptxas {'; '.join(k.get('ptxas', {}).values())[:40]}")
    sg = sec.get("sgl", {})
    print(f"\n2b. sgl-kernel store_kv_cache kernels {sg.get('cubin', '')} ({sg.get('meta', {}).get('wheel', '')})")
    if sg.get("error"):
        print(f"   ERROR {sg['error']}")
    for name, k in sg.get("kernels", {}).items():
        regs = " ".join(f"{a}:{v['regs']}" for a, v in k.items() if a.startswith("sm_"))
        sx = k.get("sass", {})
        print(f"   {name[-60:]:<60} regs {regs:<9} LDG {widths(sx.get('ld_widths', {})):<14} "
              f"STG {widths(sx.get('st_widths', {})):<14} PDL {'y' if k.get('pdl') else 'n'}")
    nc = sec["ncu"]
    print(f"\n3. ncu {nc.get('ncu', '')} {'ERROR ' + nc['error'] if nc.get('error') else ''} {nc.get('note', '')}")
    if nc.get("kernels"):
        print(f"   {'point':<18} {'grid':>14} {'block':>12} {'regs':>4} {'us':>7} {'DRAM MB':>8} {'needed':>7} "
              f"{'GB/s':>6} {'L2 GB/s':>7} {'sm%':>5} {'mem%':>5}")
    for k in nc.get("kernels", []):
        t, rd, wr, regs, sm, mem = (k.get(m) if isinstance(k.get(m), float) else 0.0 for m in (
            "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "launch__registers_per_thread",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"))
        print(f"   {k.get('label', k['kernel'][:18]):<18} {k['grid']:>14} {k['block']:>12} {regs:>4.0f} {t * 1e6:7.2f} "
              f"{(rd + wr) / 1e6:8.2f} {k.get('needed_bytes', 0) / 1e6:7.2f} {k.get('dram_GBps') or 0:6.0f} "
              f"{k.get('l2_GBps') or 0:7.0f} {sm:5.1f} {mem:5.1f}")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--ncu-child":
        ncu_child(sys.argv[2])
        return 0
    if not torch.cuda.is_available():
        print("kernel_facts: needs a CUDA device (torch.cuda.is_available() is False); nothing measured")
        return 2
    import triton
    out = Path(os.environ.get("OUT", "/tmp/kvprof-gpu"))
    out.mkdir(parents=True, exist_ok=True)
    doc: dict = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                     sections={})
    for name, fn in (("triton", triton_facts), ("cuda", cuda_facts), ("sgl", sgl_facts), ("ncu", ncu_facts)):
        t = time.perf_counter()
        try:
            doc["sections"][name] = fn()
        except Exception as exc:
            doc["sections"][name] = dict(error=oneline(exc))
        log(f"{name}: {time.perf_counter() - t:.1f} s {doc['sections'][name].get('error') or ''}")
        doc["elapsed_s"] = round(time.perf_counter() - T0, 1)
        atomic_write_text(out / "kernel-facts.json", json.dumps(doc, indent=1, default=str))  # after every section
    try:
        summary(doc)
    except Exception as exc:  # the JSON is written already
        print(f"summary failed ({oneline(exc)}); see the JSON")
    print(f"\nwrote {out / 'kernel-facts.json'} ({doc['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
