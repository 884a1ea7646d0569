"""Profile any command under Nsight Systems with kvprof's allow-listed environment, then export and scrub.

    kvprof nsys --out /tmp/prof/server [--pass-env NAME]... [--duration S] -- python -m sglang.launch_server ...

nsys stores the whole environment of the process it profiles in the report (and, unless it
runs in its own PID namespace, that of every process it can read), and an .nsys-rep cannot
be rewritten afterwards. So this runs nsys as `kvprof capture` does: the command gets only
the variables on kvprof's allow-list (`kvprof.tools.envsafe`: PATH, PYTHONPATH,
LD_LIBRARY_PATH, HOME, the locale, CUDA_*/NCCL_*/TORCH_*/TRITON_* settings that do not look
secret, kvprof's own KVPROF_* switches), plus any `--pass-env NAME`; nsys runs in a private
PID namespace where the system allows it (a warning says when it cannot). Then the report is
exported to OUT.sqlite with the same environment and the export is scrubbed (`kvprof scrub`).
Share OUT.sqlite; OUT.nsys-rep holds the allow-listed environment and, without the private
namespace, other processes' environments too.

nsys's output and the command's go to OUT.nsys.log and to the terminal. `--duration`
stops collection after S seconds and ends the command (a server: exit 0 then); without it
nsys waits for the command to exit. Exit status: the command's (a non-zero one still exports
what nsys recorded); 5 when nsys is missing or fails, 2 for a bad option.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvprof.commands import command_flags
from kvprof.commands.argtypes import positive_float

# nsys's exit status when --duration ran out and it ended the command with SIGTERM (its
# default --kill): 128 + 15, measured with nsys 2025.3.1 on the H200
DURATION_END = 143


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, metavar="BASE",
                        help="where to write: BASE.nsys-rep, BASE.sqlite (scrubbed), BASE.nsys.log")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="also pass this variable to the command (repeatable; the report will hold it)")
    parser.add_argument("--trace", default="cuda,nvtx", help="nsys --trace (default cuda,nvtx)")
    parser.add_argument("--cuda-graph-trace", default="node", choices=("node", "graph", "none"),
                        help="nsys --cuda-graph-trace (default node: every replayed kernel tied to its node)")
    parser.add_argument("--capture-range", default="none", choices=("none", "cudaProfilerApi"),
                        help="record only between cudaProfilerStart/Stop (default: the whole run)")
    parser.add_argument("--duration", type=positive_float, metavar="S",
                        help="stop collecting after S seconds and end the command (for a server)")
    parser.add_argument("--timeout", type=positive_float, metavar="S",
                        help="kill nsys and the command after S seconds (default: no limit)")
    parser.add_argument("profiled", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the command to profile, after --")


def run(args: argparse.Namespace) -> int:
    from kvprof.core.errors import UsageError
    from kvprof.core.rundir import RunDir
    from kvprof.tools.envsafe import child_environment, describe
    from kvprof.tools.nsys import check_profiled_command, export_sqlite, require_nsys, run_nsys_pass
    from kvprof.tools.scrub import scrub_path

    command = list(args.profiled)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("no command to profile: give it after --, e.g. kvprof nsys --out prof -- python run.py")
    check_profiled_command(command)
    base = RunDir.nsys_base_of(Path(args.out))
    env = child_environment(pass_env=args.pass_env, names=command_flags(add_arguments))
    nsys = require_nsys()
    print(f"kvprof nsys: {nsys}; the command gets {len(env)} variables: {', '.join(describe(env))}",
          file=sys.stderr, flush=True)
    result = run_nsys_pass(
        nsys, base, command, env, args.timeout, echo=sys.stderr, check=False, trace=args.trace,
        cuda_graph_trace=None if args.cuda_graph_trace == "none" else args.cuda_graph_trace,
        capture_range=args.capture_range, duration=args.duration,
    )
    sqlite = export_sqlite(nsys, result.report, RunDir.nsys_sqlite_of(base), env=env)
    scrubbed = scrub_path(sqlite)
    isolation = "isolated" if result.isolated else "NOT isolated: it may hold other processes' environments"
    print(f"report: {result.report} ({isolation})")
    print(f"export: {scrubbed.line()}")
    print(f"log: {result.log}")
    if args.duration is not None and result.returncode == DURATION_END:
        print(f"kvprof nsys: nsys ended the command after {args.duration:g} s (--duration)", file=sys.stderr)
        return 0
    if result.returncode:
        print(f"kvprof nsys: the command exited with {result.returncode}; what nsys recorded was exported",
              file=sys.stderr)
    return result.returncode
