"""Check that writers write the right bytes: each against its layout's reference, over random cases.

Differential testing: every case is one write, drawn at random from --seed (dtypes, fp8
with scales included; row shapes; token counts; slot patterns: random, a strided loc view,
duplicate slots, padding slots, the first and last slot, a run of slots, no tokens; inputs
dense, flat or token-strided; the rope contract's rotation). The writer and the layout's
reference write two pools that start from the same random bytes, and every byte of every
buffer is compared (docs/verify.md says what that proves and what it does not). A writer may
refuse a call if it changes nothing.

Default: every registered writer of every layout that can run on the device, least time
spent first, until each has run --cases cases or --budget seconds have passed (on a CPU the
Triton writers run in Triton's interpreter). Prints a table per writer and, for each wrong
case, the wrong rows and bytes and one command that reruns exactly that case (--case N).

--pdl checks instead what a kernel launched right after each write with programmatic
dependent launch reads after its griddepcontrol.wait (CUDA, sm_90+): stale rows per writer.

Exit 0: every case right or refused with nothing changed; 7: a case wrote a wrong byte, or a
writer raised something other than a refusal; 1: the budget ran out before a writer ran any
case; 2: a bad argument or unknown writer; 4: a writer named cannot run on the device.
"""

from __future__ import annotations

import argparse
import time

from kvprof.commands import command_flags
from kvprof.commands.argtypes import non_negative_int, positive_float, positive_int, positive_ints, seed


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text[:60]!r}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    # the budget counts from here (the command's parser is built first thing): torch's import and
    # the writers' builds are inside it
    p.set_defaults(started=time.perf_counter())
    # the defaults are here as numbers, not imported: --help must not import torch
    p.add_argument("--variants", type=_names, default=None, metavar="NAME,...",
                   help="registered writers or module:function specs, comma-separated (default: every registered "
                        "writer that can run on the device)")
    p.add_argument("--layout", type=_names, default=None, metavar="LAYOUT,...",
                   help="mha, mla and/or paged (default: all; a module:function spec is tried in each)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--budget", type=positive_float, default=40.0, metavar="SECONDS",
                   help="start no case after this many seconds from the command's start (torch's import and the "
                        "writers' builds included; a case under way finishes) (default: %(default)s)")
    p.add_argument("--cases", type=positive_int, default=200, metavar="N",
                   help="cases per writer at most (default: %(default)s)")
    p.add_argument("--seed", type=seed, default=0, help="the cases drawn (default: %(default)s)")
    p.add_argument("--case", type=non_negative_int, default=None, metavar="INDEX",
                   help="run only case INDEX of each writer (what a failing case's rerun line gives)")
    p.add_argument("--pdl", action="store_true",
                   help="instead: PDL visibility (CUDA sm_90+): after each write a kernel launched with PDL reads the "
                        "rows just written after its griddepcontrol.wait; counts stale reads per writer that launches "
                        "with PDL or whose library decides (SGLang's kernels)")
    p.add_argument("--trials", type=positive_int, default=256, metavar="N",
                   help="--pdl: writes per token count (default: %(default)s)")
    p.add_argument("--tokens", type=positive_ints, default=[1, 7, 64, 512, 4096], metavar="N,...",
                   help="--pdl: token counts, the grid sizes (default: 1,7,64,512,4096)")
    import kvprof.report.verify  # noqa: F401 - registers the forms of verify's results
    from kvprof.core.verify import PdlResult, VerifyResult
    from kvprof.report.renderers import formats

    p.add_argument("--format", choices=formats(VerifyResult, PdlResult), default="table",
                   help="table (default), or the result as one JSON document on stdout")


def run(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.core.errors import KvprofError, WrongWriteError
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import table_console
    from kvprof.report.verify import verdict_line

    if args.pdl:
        return _run_pdl(args)
    names = command_flags(add_arguments)
    result = api.verify(args.variants, args.layout, device=args.device, budget_s=args.budget, cases=args.cases,
                        seed=args.seed, case=args.case, started=args.started, names=names)
    console = table_console(args.format)
    render(args.format, result, Output(console=console if args.format == "table" else None, names=names))
    if args.format != "table":  # the verdict for people, beside the document
        console.print(verdict_line(result), soft_wrap=True, highlight=False, markup=False)
    if not result.passed:
        raise WrongWriteError(f"{result.failed} of {result.cases_run} cases failed; rerun one with the line under it")
    if result.untested:
        raise KvprofError(f"the budget of {args.budget:g} s ran out before {len(result.untested)} writer(s) ran a case "
                          f"({', '.join(w.writer for w in result.untested)}); raise --budget")
    return 0


def _run_pdl(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.core.errors import UsageError, WrongWriteError
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import table_console
    from kvprof.report.verify import pdl_verdict

    if args.case is not None:
        raise UsageError("--case reruns a case of the differential run; --pdl has none")
    result = api.verify_pdl(args.variants, args.layout, device=args.device, trials=args.trials, tokens=args.tokens,
                            seed=args.seed)
    names = command_flags(add_arguments)
    console = table_console(args.format)
    render(args.format, result, Output(console=console if args.format == "table" else None, names=names))
    if args.format != "table":
        console.print(pdl_verdict(result, names), soft_wrap=True, highlight=False, markup=False)
    if not result.passed:
        raise WrongWriteError(f"{result.stale} stale reads after griddepcontrol.wait")
    return 0
