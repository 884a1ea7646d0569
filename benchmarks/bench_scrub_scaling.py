"""scrub's time against the size of its input: every pass is meant to be linear.

    python benchmarks/bench_scrub_scaling.py [--sizes 16,32,64,128,256] [--repeat 3] [--only base64]

For each input shape and size (KiB of the string or the file) it times ``scrub --check`` and
``scrub`` (in this process, after one warm-up; the best of --repeat), against an environment
with one secret and one host name, none of which the input holds (the worst case: every pass
runs to the end without finding anything); each call builds its rules anew (they cache what an
encoded run holds). The shapes are the ones that were quadratic or
could be: one long base64 string in a JSON trace, one long run of letters (a word with no
break), one JSON string of escapes and look-alike letters, one array of many short strings (the
split-secret join), a log of many lines, a long UTF-32 log, an unknown binary file. The last
column, µs per KiB, stays flat when the time is linear; ``ratio`` is the time per KiB at the
largest size over that at the smallest (about 1 for linear, about the size ratio for quadratic).
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ENV = {"HF_TOKEN": "hf_Zq8RkT2mWv9LpX4nBc7Ys1Dj", "KVPROF_BENCH_SECRET": "Qm3Zx9Lr2Vw8Kt5Np1"}
HOST = "gpu-node-77"


def _json(doc: object) -> bytes:
    return orjson.dumps(doc)


def shape_base64(n: int, rnd: random.Random) -> tuple[str, bytes]:
    s = base64.b64encode(rnd.randbytes(n * 3 // 4)).decode()
    return "t.json", _json({"traceEvents": [{"ph": "M", "name": "blob", "args": {"data": s}}]})


def shape_letters(n: int, rnd: random.Random) -> tuple[str, bytes]:
    return "t.json", _json({"traceEvents": [{"ph": "M", "name": "a" * n, "args": {}}]})


def shape_escapes(n: int, rnd: random.Random) -> tuple[str, bytes]:
    unit = "k\u200bv\u0430\uff50\\u0041%41&#66;\x1b[1m"
    s = (unit * (n // len(unit.encode()) + 1))[: n // 2]
    return "t.json", _json({"traceEvents": [{"ph": "M", "name": s, "args": {}}]})


def shape_many_strings(n: int, rnd: random.Random) -> tuple[str, bytes]:
    parts = ["".join(rnd.choice("abcdefgh") for _ in range(6)) for _ in range(n // 9)]
    return "t.json", _json({"traceEvents": [{"ph": "M", "name": "argv", "args": {"argv": parts}}]})


def shape_log(n: int, rnd: random.Random) -> tuple[str, bytes]:
    line = "step 12 layer 3 set_kv_buffer tokens=256 took 4.2 us on NVIDIA H200\n"
    return "run.log", (line * (n // len(line) + 1)).encode()[:n]


def shape_utf32(n: int, rnd: random.Random) -> tuple[str, bytes]:
    line = "step 12 layer 3 set_kv_buffer tokens=256 took 4.2 us\n"
    return "run.log", (line * (n // (4 * len(line)) + 1)).encode("utf-32")[:n - n % 4]


def shape_binary(n: int, rnd: random.Random) -> tuple[str, bytes]:
    return "blob.bin", rnd.randbytes(n)


SHAPES: dict[str, Callable[[int, random.Random], tuple[str, bytes]]] = {
    "JSON: one base64 string": shape_base64,
    "JSON: one run of letters": shape_letters,
    "JSON: escapes, look-alikes": shape_escapes,
    "JSON: array of short strings": shape_many_strings,
    "log: many lines": shape_log,
    "log: UTF-32": shape_utf32,
    "unknown binary file": shape_binary,
}


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16,32,64,128,256", help="KiB, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="only the inputs whose label contains this text")
    args = ap.parse_args()
    from kvprof.tools.scrub import Rules, check_path, scrub_path
    from kvprof.tools.scrub.rules import DEFAULT_MAX_BYTES

    sizes = [int(s) for s in args.sizes.split(",")]

    def rules() -> Rules:  # new each time: a Rules caches what its encoded runs hold
        return Rules(ENV, home="/home/benchuser", hostnames=[HOST], max_bytes=DEFAULT_MAX_BYTES)

    print(f"{'input':32} {'KiB':>6} {'check s':>9} {'scrub s':>9} {'µs/KiB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, make in SHAPES.items():
            if args.only not in label:
                continue
            per_kib = []
            for kib in sizes:
                name, data = make(kib * 1024, random.Random(kib))
                path = Path(tmp, name)
                path.write_bytes(data)
                t_check = best_of(args.repeat, lambda: check_path(path, rules=rules()))

                def scrub_once() -> None:
                    path.write_bytes(data)
                    scrub_path(path, env=ENV, max_bytes=DEFAULT_MAX_BYTES)

                t_scrub = best_of(args.repeat, scrub_once)
                per_kib.append((t_check + t_scrub) / kib * 1e6)
                print(f"{label:32} {kib:6} {t_check:9.4f} {t_scrub:9.4f} {per_kib[-1]:8.0f}")
                os.unlink(path)
            print(f"{label:32} ratio of µs/KiB, {sizes[-1]} KiB over {sizes[0]} KiB: {per_kib[-1] / per_kib[0]:.2f}")


if __name__ == "__main__":
    main()
