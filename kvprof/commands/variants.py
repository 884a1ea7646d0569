"""List the write variants and whether each can run here (device, dtypes), with the reason if not."""

from __future__ import annotations

import argparse


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
    from rich.console import Console
    from rich.table import Table

    from kvprof.core.text import markup
    from kvprof.devinfo import resolve_device, triton_interpreter

    device = resolve_device(args.device)
    # as capture and bench do: Triton's interpreter on a CPU, decided when the writers import
    interpret = triton_interpreter(device) or "off"

    from kvprof.core.errors import KvprofError
    from kvprof.dtypes import parse_dtype
    from kvprof.writers import create_writer, writer_names

    cache = parse_dtype(args.cache_dtype)
    inp = parse_dtype(args.input_dtype) if args.input_dtype else cache
    table = Table(title=f"write variants on {device}")
    for col in ("variant", "fused", "runs here", "description"):
        table.add_column(col)
    marked = False
    for name in writer_names():  # every cell escaped: a hint's "[triton]" is text, not a rich tag
        try:
            w = create_writer(name)
            reason = w.unsupported_reason(device, cache, inp)
            star = reason is None and bool(w.info().extra.get("interpreted"))
            marked |= star
            table.add_row(markup(name + (" *" if star else "")), markup(_fused_word(w)),
                          "yes" if reason is None else markup(f"no: {reason}"), markup(w.description))
        except KvprofError as exc:
            table.add_row(markup(name), "?", markup(f"no: {exc}"), "")
    if marked:
        table.caption = markup(f"* runs its Triton kernel in Triton's interpreter (TRITON_INTERPRET=1, {interpret}): "
                               "on the host, in numpy; its times are not a GPU's")
        table.caption_justify = "left"
    Console().print(table)
    return 0

