"""``python -m kvprof``: one entry point, one module per subcommand in ``kvprof/commands``.

Each command module has a docstring (its first line is the help), ``add_arguments`` and
``run``; heavy imports happen inside ``run`` so ``--help`` stays fast. User errors
(``KvprofError``) become one line on stderr and the error's exit code; so do argument
errors (exit 2, one line instead of argparse's usage block), a full or read-only disk
(exit 6), a path longer than the system takes (exit 2), Ctrl-C, at any moment including
start-up (130), SIGTERM (143) and the other signals that end a process by default (SIGHUP,
SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM: 128 + the signal's number). A closed stdout (a pipe into
``head``) ends the command quietly with exit 0. Output the terminal's encoding cannot show
(``PYTHONIOENCODING=ascii``: µ, box drawing) is written with replacement characters instead
of ending in UnicodeEncodeError.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from kvprof import __version__
from kvprof.commands import flag_namer
from kvprof.core.atomic import DISK_ERRNOS  # a full or read-only disk: exit 6, never a traceback
from kvprof.core.errors import INTERRUPTED_EXIT_CODE, KvprofError, OutputError, UsageError, rendered
from kvprof.core.interrupts import Terminated, ctrl_c_raises_interrupted
from kvprof.core.text import printable

COMMANDS = ("capture", "analyze", "compare", "report", "bench", "dashboard", "scrub", "nsys", "variants", "verify")


class OneLineParser(argparse.ArgumentParser):
    """argparse, with an argument error reported as one line (exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``only`` (the command being run: the other eight
    modules are then not imported, 50 ms of every start)."""
    parser = OneLineParser(
        prog="kvprof",
        description="Profile how an LLM serving engine writes keys and values into its KV cache.",
    )
    parser.add_argument("--version", action="version", version=f"kvprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (only,) if only in COMMANDS else COMMANDS:
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


@contextlib.contextmanager
def unencodable_replaced() -> Iterator[None]:
    """stdout and stderr replace what their encoding cannot hold (``PYTHONIOENCODING=ascii``
    and a µ or a table's box drawing), restored afterwards for a caller that runs ``main``."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            with contextlib.suppress(ValueError, OSError):  # a closed or detached stream
                reconfigure(errors="replace")
                changed.append(reconfigure)
    try:
        yield
    finally:
        for reconfigure in changed:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="strict")


def _path_shown(path: object) -> str:
    text = str(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-37:]}"


def main(argv: Sequence[str] | None = None) -> int:
    with unencodable_replaced():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    prog = "kvprof"
    parser: argparse.ArgumentParser | None = None
    try:
        # the handlers cover start-up too: building the parser imports torch for seconds
        with ctrl_c_raises_interrupted():
            words = sys.argv[1:] if argv is None else list(argv)
            parser = build_parser(words[0] if words else None)
            args = parser.parse_args(words)
            if not getattr(args, "_run", None):
                parser.print_help()
                return 2
            prog = f"kvprof {args.command}"
            return int(args._run(args) or 0)
    except KvprofError as exc:
        # it can quote a trace's text; the settings it names, as this command's flags
        print(f"{prog}: error: {printable(rendered(exc, flag_namer(parser)))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        kept = printable(rendered(getattr(exc, "kept", None) or "nothing half-written was kept", flag_namer(parser)))
        if isinstance(exc, Terminated):
            word = "terminated" if exc.signum == signal.SIGTERM else f"terminated ({exc.signum.name})"
            print(f"{prog}: {word}; {kept}", file=sys.stderr)
            return exc.exit_code
        print(f"{prog}: interrupted; {kept}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except BrokenPipeError:
        quiet_closed_stdout()
        return 0
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # a path the user gave, too long for the system
            where = f": {_path_shown(exc.filename)}" if exc.filename else ""
            print(f"{prog}: error: {exc.strerror or exc}{where}", file=sys.stderr)
            return UsageError.exit_code
        if exc.errno not in DISK_ERRNOS:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(f"{prog}: error: {exc.strerror or exc}{where}; nothing half-written was kept", file=sys.stderr)
        return OutputError.exit_code


def run_as_program() -> NoReturn:
    """``python -m kvprof``: ``main``, then Ctrl-C ignored while the interpreter shuts down.

    Once the command has returned, its outputs are complete and its exit code is decided; a
    Ctrl-C that landed in the interpreter's own shutdown (after Python's handlers are gone)
    used to end the process by signal (-2) with no message instead of that code.
    """
    try:
        code = main()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(code)
