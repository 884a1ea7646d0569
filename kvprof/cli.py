"""``python -m kvprof``: one entry point, one module per subcommand in ``kvprof/commands``.

Each command module has a docstring (its first line is the help), ``add_arguments`` and
``run``; heavy imports happen inside ``run`` so ``--help`` stays fast. User errors
(``KvprofError``) become one line on stderr and the error's exit code; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvprof import __version__
from kvprof.errors import INTERRUPTED_EXIT_CODE, KvprofError
from kvprof.interrupts import ctrl_c_raises_interrupted

COMMANDS = ("capture", "analyze", "compare", "bench", "dashboard", "scrub", "variants")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvprof",
        description="Profile how an LLM serving engine writes keys and values into its KV cache.",
    )
    parser.add_argument("--version", action="version", version=f"kvprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"kvprof.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kvprof.commands.{name}":
                raise
            continue  # a command not built in this checkout
        doc = (module.__doc__ or name).strip()
        help_line = doc.splitlines()[0]
        p = sub.add_parser(name, help=help_line, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        with ctrl_c_raises_interrupted():
            return int(args._run(args) or 0)
    except KvprofError as exc:
        print(f"kvprof {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"kvprof {args.command}: interrupted; nothing half-written was kept", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except BrokenPipeError:
        return 0
