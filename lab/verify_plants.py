"""How often ``kvprof verify`` catches each planted wrong writer (tests/planted_writers.py): per
plant and seed, the cases run, and how many were wrong, right, refused or in error.

    python lab/verify_plants.py [--seeds 0,1,2] [--cases 16]

Any CPU, seconds (the plants are torch writers). docs/verify.md quotes its output.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kvprof.verify import verify  # noqa: E402

PLANTS = ("off_by_one", "one_wrong_byte", "contiguous_loc", "strided_storage", "neighbour_slot", "skips_v",
          "refuses_after_writing", "paged_contiguous_loc", "mla_writes_skipped", "stale_k_rope",
          # right ones, for contrast
          "refuses_cleanly", "torch_rope", "first_token_wins", "skips_dummy_slot")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--cases", type=int, default=16)
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{'plant':<22} {'layout':<6} {'seed':>4} {'cases':>5} {'wrong':>5} {'ok':>3} {'refused':>7} {'errors':>6}"
          f" {'s':>5}")
    for name in PLANTS:
        for seed in seeds:
            began = time.perf_counter()
            r = verify([f"planted_writers:{name}"], device=torch.device("cpu"), budget_s=600, cases=args.cases,
                       seed=seed)
            (w,) = r.writers
            print(f"{name:<22} {w.layout:<6} {seed:>4} {w.cases:>5} {w.wrong:>5} {w.ok:>3} {w.refused:>7} "
                  f"{w.errors:>6} {time.perf_counter() - began:>5.1f}")


if __name__ == "__main__":
    main()
