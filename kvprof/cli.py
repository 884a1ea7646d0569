"""``python -m kvprof``: one entry point, one module per subcommand in ``kvprof/commands``.

Each command module has a docstring (its first line is the help), ``add_arguments`` and
``run``; heavy imports happen inside ``run`` so ``--help`` stays fast. User errors
(``KvprofError``) become one line on stderr and the error's exit code; so do argument
errors (exit 2, one line instead of argparse's usage block), a full or read-only disk
(exit 6), Ctrl-C, at any moment including start-up (130) and SIGTERM (143). A closed
stdout (a pipe into ``head``) ends the command quietly with exit 0.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn
from collections.abc import Sequence

from kvprof import __version__
from kvprof.core.atomic import DISK_ERRNOS  # a full or read-only disk: exit 6, never a traceback
from kvprof.core.errors import INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE, KvprofError, OutputError
from kvprof.core.interrupts import Terminated, ctrl_c_raises_interrupted
from kvprof.core.text import printable

COMMANDS = ("capture", "analyze", "compare", "report", "bench", "dashboard", "scrub", "nsys", "variants")


class OneLineParser(argparse.ArgumentParser):
    """argparse, with an argument error reported as one line (exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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


def quiet_closed_stdout() -> None:
    """The reader of our stdout went away (``kvprof analyze RUN | head -1``): not an error.

    Point stdout at /dev/null so the interpreter's final flush of what is still buffered
    does not print "Exception ignored ... BrokenPipeError" on the way out.
    """
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    prog = "kvprof"
    try:
        # the handlers cover start-up too: building the parser imports torch for seconds
        with ctrl_c_raises_interrupted():
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "_run", None):
                parser.print_help()
                return 2
            prog = f"kvprof {args.command}"
            return int(args._run(args) or 0)
    except KvprofError as exc:
        print(f"{prog}: error: {printable(exc)}", file=sys.stderr)  # it can quote a trace's text
        return exc.exit_code
    except KeyboardInterrupt as exc:
        word = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{prog}: {word}; nothing half-written was kept", file=sys.stderr)
        return TERMINATED_EXIT_CODE if isinstance(exc, Terminated) else INTERRUPTED_EXIT_CODE
    except BrokenPipeError:
        quiet_closed_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"{prog}: error: {exc.strerror or exc}{where}; nothing half-written was kept", file=sys.stderr)
        return OutputError.exit_code
