"""One module per ``python -m kvprof`` subcommand (see kvprof/cli.py for the contract).

The command line's option names live here and nowhere below: a message from the layers
below names a setting by its field (``kvprof.core.errors.Setting``), and ``flag_namer``
spells it as the command's parser does (``decode_sizes`` is ``--batch-sizes``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

# settings whose field (the Python API's name) is not the parser's dest
FIELD_DEST = {"phases": "phase", "layouts": "layout", "write_kernel_regex": "write_kernels"}


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> the option's first long flag, for a parser and every subparser below it."""
    out: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for dest, flag in flag_names(sub).items():
                    out.setdefault(dest, flag)
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in out:
            out[action.dest] = longs[0]
    return out


def flag_namer(parser: argparse.ArgumentParser | None) -> Callable[[str], str]:
    """A setting's field -> its flag on ``parser`` (``--`` and the field's words where the parser
    has no such option, as kvprof's options are named)."""
    flags = flag_names(parser) if parser is not None else {}

    def name(field: str) -> str:
        dest = FIELD_DEST.get(field, field)
        return flags.get(dest) or "--" + dest.replace("_", "-")

    return name


def command_flags(*add_arguments: Callable[[argparse.ArgumentParser], None]) -> Callable[[str], str]:
    """A setting's field -> its flag on the parsers the commands' ``add_arguments`` build, the
    first command's own first (what a command hands to the layers below as ``names``; the others:
    commands whose settings its output names, as compare's names capture's reference steps)."""
    parser = argparse.ArgumentParser(add_help=False)
    commands = parser.add_subparsers()
    for i, add in enumerate(add_arguments):
        add(commands.add_parser(str(i), add_help=False))
    return flag_namer(parser)


def add_format_arguments(parser: argparse.ArgumentParser, forms: Sequence[str]) -> None:
    """``--format`` with the forms the command's result renders in (kvprof.report.renderers.formats:
    table first, the default, then the documents), and ``--json`` for short."""
    if not forms or forms[0] != "table":
        raise ValueError(f"--format needs the table form first, the default; the result renders as {list(forms)}")
    documents = [f for f in forms if f != "table"]
    parser.add_argument("--format", choices=tuple(forms), default="table",
                        help=f"table (default), or one {' / '.join(documents)} document on stdout with everything "
                             "else on stderr")
    if "json" in documents:
        parser.add_argument("--json", dest="format", action="store_const", const="json",
                            help="same as --format json")
