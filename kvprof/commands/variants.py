"""List the write variants and whether each can run here (device, dtypes), with the reason if not."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvprof.commands.progress import StepProgress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--cache-dtype", default="bf16")
    p.add_argument("--input-dtype", default=None)


def _fused_word(writer: object) -> str:
    """yes/no: one launch writes K and V; a rope + store writer says where its rotation runs."""
    word = "yes" if getattr(writer, "fused", False) else "no"
    rope = writer.info().extra.get("rope")  # type: ignore[attr-defined]
    if rope == "fused":
        return "into rope"  # one launch rotates q and k and writes K and V
    if rope == "separate":
        return f"{word} (rope apart)"
    return word


def run(args: argparse.Namespace) -> int:
    from kvprof.commands.progress import StepProgress

    # shown at once on a terminal (torch and the writers load for seconds on a small machine),
    # as capture and bench do; gone before the table prints
    bar = StepProgress(None, description="loading torch", width=22)
    try:
        return _list(args, bar)
    finally:
        bar.close()


def _list(args: argparse.Namespace, bar: StepProgress) -> int:
    from rich.text import Text

    from kvprof.kvcache.devinfo import resolve_device, triton_interpreter

    device = resolve_device(args.device)
    # as capture and bench do: Triton's interpreter on a CPU, decided when the writers import
    interpret = triton_interpreter(device) or "off"

    from kvprof.core.errors import KvprofError
    from kvprof.kvcache.dtypes import parse_dtype
    from kvprof.kvcache.writers import create_writer, writer_names
    from kvprof.report.cells import FitCol, fit_table
    from kvprof.report.terminal import make_console

    cache = parse_dtype(args.cache_dtype)
    inp = parse_dtype(args.input_dtype) if args.input_dtype else cache
    rows = []
    marked = False
    names = writer_names()
    bar.set_total(len(names))
    for name in names:
        bar.describe(f"building {name}"[:22])
        try:
            w = create_writer(name)
            reason = w.unsupported_reason(device, cache, inp)
            star = reason is None and bool(w.info().extra.get("interpreted"))
            marked |= star
            rows.append([name + (" *" if star else ""), _fused_word(w), "yes" if reason is None else f"no: {reason}",
                         w.description])
        except KvprofError as exc:
            rows.append([name, "?", f"no: {exc}", ""])
        bar.advance()
    bar.close()
    console = make_console()
    # the names you type are never cut: the description wraps, then goes, then the reasons wrap
    cols = [FitCol("variant", "left"), FitCol("fused", "left", wrap=True, min_wrap=9),
            FitCol("runs here", "left", wrap=True, min_wrap=14), FitCol("description", "left", wrap=True, drop=1)]
    table, notes = fit_table(f"write variants on {device}", cols, rows, console.width)
    console.print(table)
    if marked:
        console.print(Text(f"* runs its Triton kernel in Triton's interpreter (TRITON_INTERPRET=1, {interpret}): "
                           "on the host, in numpy; its times are not a GPU's"))
    for line in notes:
        console.print(Text(line, style="dim"))
    return 0

