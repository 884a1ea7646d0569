"""Take sgl-kernel's store_kv_cache kernels out of its published wheel, as a cubin.

    python -m kvprof.kvcache.writers.sgl_cubin_extract [--version 0.3.21] [--out .gpu/sgl]

Why: a GPU machine without a package registry cannot install sgl-kernel, and its wheel (over
500 MB, built against its own torch) cannot be loaded beside another torch. Its
``store_kv_cache`` kernels are device code with no torch in them: this script downloads
the wheel from PyPI (here, where the registry is reachable), reads its sm_90 ``common_ops``
library, lists the embedded cubins with ``cuobjdump`` (Triton's bundled copy, CUDA's, or
PATH) and keeps the one that holds ``store_kv_cache_256x1``/``store_kv_cache_128x2``. It
writes ``store_kv_cache.sm_90.cubin`` (about 24 KB) and ``store_kv_cache.sm_90.json``
(wheel name and SHA-256, member, cubin SHA-256, kernel names) to ``--out``; the
``sgl_kernel_cubin`` writer loads it (``KVPROF_SGL_CUBIN``). Where the wheel also holds the
fused rope + store kernels (``BatchQKApplyRotaryPosIdsCosSinCacheEnhanced*``), their cubin
(about 1 MB) goes beside it as ``sgl_rope.sm_90.cubin`` + ``.json``, for
``sgl_kernel_rope_cubin``. Nothing of sgl-kernel is committed to kvprof: run this where you
need the peer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from kvprof.kvcache.writers.rope_sgl_cubin import RopeCubin

PROG = "python -m kvprof.kvcache.writers.sgl_cubin_extract"


def fail(msg: str) -> NoReturn:
    print(f"sgl_cubin_extract: error: {msg}", file=sys.stderr)
    raise SystemExit(1)


def find_cuobjdump() -> str:
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    except Exception:  # noqa: BLE001  (no triton: try the others)
        pass
    for candidate in (os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/bin/cuobjdump", shutil.which("cuobjdump")):
        if candidate and Path(candidate).is_file():
            return candidate
    fail("no cuobjdump (install triton, or a CUDA toolkit)")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _wheel(version: str, cache: Path) -> Path:
    """sgl-kernel's manylinux wheel of ``version`` in ``cache``, downloaded there first if absent."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"sgl_kernel-{version}-*manylinux*x86_64.whl"))
    if not found:
        print(f"downloading sgl-kernel {version} from PyPI (about 500 MB) ...", flush=True)
        rc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                             "--python-version", "3.12", "--platform", "manylinux2014_x86_64",
                             f"sgl-kernel=={version}", "-d", str(cache)]).returncode
        found = sorted(cache.glob(f"sgl_kernel-{version}-*manylinux*x86_64.whl"))
        if rc or not found:
            fail(f"pip could not download sgl-kernel=={version}")
    return found[0]


def _common_ops(wheel: Path) -> tuple[zipfile.ZipFile, str]:
    """The wheel, opened, and the name of its sm90 ``common_ops`` library."""
    if not wheel.is_file():
        fail(f"no wheel at {wheel}")
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        fail(f"{wheel} is not a wheel (bad zip)")
    members = [n for n in zf.namelist() if "sm90/" in n and Path(n).name.startswith("common_ops") and n.endswith(".so")]
    if not members:
        fail(f"{wheel.name} has no sm90 common_ops library")
    return zf, members[0]


def _extract_cubins(zf: zipfile.ZipFile, member: str, cuobjdump: str, tmp: Path) -> list[Path]:
    """Every sm_90 cubin embedded in ``member``, written under ``tmp`` by cuobjdump."""
    so = tmp / "common_ops.so"
    with zf.open(member) as src, open(so, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    cubins = tmp / "cubins"
    cubins.mkdir()
    r = subprocess.run([cuobjdump, "-xelf", "all", str(so)], cwd=cubins, capture_output=True, text=True)
    if r.returncode:
        fail(f"cuobjdump -xelf failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return sorted(cubins.glob("*.sm_90.cubin"))


def _rope_cubin(cubins: list[Path]) -> tuple[Path, RopeCubin] | None:
    """sgl-kernel's fused rope + store kernels (the sgl_kernel_rope_cubin writer), where the
    wheel has them and they read as that writer needs; why not, on stderr, where they do not."""
    rope_hits = [p for p in cubins if b"BatchQKApplyRotaryPosIdsCosSinCacheEnhancedKernel" in p.read_bytes()]
    if not rope_hits:
        return None
    from kvprof.kvcache.writers.rope_sgl_cubin import read_rope_cubin

    try:
        return rope_hits[0], read_rope_cubin(rope_hits[0])
    except ValueError as exc:
        print(f"sgl_cubin_extract: no rope cubin written: {exc}", file=sys.stderr)
        return None


def _write_with_record(dest: Path, meta: dict[str, Any], image: bytes) -> None:
    """The record first, then the cubin: a cubin on disk always has its record beside it."""
    from kvprof.core.atomic import atomic_write_bytes, atomic_write_text

    try:
        atomic_write_text(dest.with_suffix(".json"), json.dumps(meta, indent=1) + "\n")
        atomic_write_bytes(dest, image)
    except OSError as exc:
        fail(f"cannot write {dest}: {exc.strerror or exc}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.3.21", help="sgl-kernel version on PyPI (default: %(default)s)")
    ap.add_argument("--wheel", help="use this wheel instead of downloading one")
    ap.add_argument("--out", default=str(Path(".gpu") / "sgl"),
                    help="folder for the cubin (default: %(default)s, under the current folder)")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "kvprof" / "wheels"))
    args = ap.parse_args(argv)

    from kvprof.kvcache.writers.sgl_cubin import read_cubin

    wheel = Path(args.wheel) if args.wheel else _wheel(args.version, Path(args.cache))
    zf, member = _common_ops(wheel)
    cuobjdump = find_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        cubins = _extract_cubins(zf, member, cuobjdump, Path(tmp))
        hits = [p for p in cubins if b"store_kv_cache_256x1" in p.read_bytes()]
        if not hits:
            fail(f"no sm_90 cubin in {member} holds store_kv_cache")
        try:  # the kernels and signature the writer needs, checked before anything is written
            info = read_cubin(hits[0])
        except ValueError as exc:
            fail(str(exc))
        rope = _rope_cubin(cubins)
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail(f"cannot create {out}: {exc.strerror or exc}")
        dest = out / "store_kv_cache.sm_90.cubin"
    meta = {"wheel": wheel.name, "wheel_sha256": sha256(wheel), "member": f"{member}:{hits[0].name}",
            "cubin_sha256": info.sha256, "kernels": {f"{a} {b}": n for (a, b), n in sorted(info.kernels.items())},
            "extracted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cuobjdump": cuobjdump}
    _write_with_record(dest, meta, info.image)
    print(f"wrote {dest} ({len(info.image)} bytes, {len(info.kernels)} kernels) from {wheel.name}")
    if rope is not None:
        from kvprof.kvcache.writers.rope_sgl_cubin import ROPE_CUBIN_NAME

        rope_hit, rope_info = rope
        rope_dest = out / ROPE_CUBIN_NAME
        rope_meta = {**meta, "member": f"{member}:{rope_hit.name}", "cubin_sha256": rope_info.sha256,
                     "kernels": {f"{'gptj' if il else 'neox'} {dim} {str(dt).removeprefix('torch.')}": k.token_parallel
                                 for (il, dim, dt), k in sorted(rope_info.kernels.items(), key=str)}}
        _write_with_record(rope_dest, rope_meta, rope_info.image)
        print(f"wrote {rope_dest} ({len(rope_info.image)} bytes, {len(rope_info.kernels)} rope + store instances); "
              "sgl_kernel_rope_cubin finds it beside KVPROF_SGL_CUBIN")
    print(f"use it with: export KVPROF_SGL_CUBIN={dest}")



if __name__ == "__main__":
    main()
