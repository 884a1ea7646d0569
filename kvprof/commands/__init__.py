"""One module per ``python -m kvprof`` subcommand (see kvprof/cli.py for the contract).

The command line's option names live here and nowhere below: a message from the layers
below names a setting by its field (``kvprof.core.errors.Setting``), and ``flag_namer``
spells it as the command's parser does (``decode_sizes`` is ``--batch-sizes``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

# settings whose field (the Python API's name) is not the parser's dest
FIELD_DEST = {"phases": "phase"}


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
