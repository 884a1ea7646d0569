"""argparse types that refuse what would otherwise be quietly taken for a default, or crash later.

Through an ``x or default``, ``--pool-size 0`` or ``--max-events 0`` would mean "default";
``--itl-before nan`` passes every ``<= 0`` test; a ``--threads`` past what torch's thread pool
takes crashes it (SIGSEGV); seeds, memory sizes and counts outside their ranges end in
tracebacks. These types refuse such values at the argument, with the option's name in the
one-line error (exit 2), before torch is imported. The bounds are ``kvprof.core.limits``, so
``kvprof.kvcache.guards.check_capture_values`` holds a ``CaptureConfig`` from the Python API to the
same ones. (A writer option's text is read by ``kvprof.kvcache.registry.typed_options``.)
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from kvprof.core.limits import (  # noqa: F401  (SCALE_MIN/MAX: the capture's scale bounds)
    INT64_MAX,
    MAX_MEMORY_GB,
    SCALE_MAX,
    SCALE_MIN,
    SEED_MAX,
    THREADS_PER_CPU,
    cpu_count,
    max_threads,
)

# timed repeats per bench point: a median over more is no more precise, and 2**63 ran for ever
MAX_REPEATS = 100_000
# room a command needs inside an output folder: a run id (128), its temporary suffix and file names
OUTPUT_NAME_ROOM = 256


def _shown(text: object) -> str:
    """A value as an error repeats it: at most 60 characters of it."""
    shown = repr(text) if isinstance(text, str) else str(text)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."


def _int_in(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:  # also a number of more digits than int() reads (4300)
        raise argparse.ArgumentTypeError(f"expected {what}, got {_shown(text)}") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected {what}, got {_shown(value)}")
    return value


def positive_int(text: str) -> int:
    return _int_in(text, 1, INT64_MAX, "a positive integer (at most 2**63-1)")


def non_negative_int(text: str) -> int:
    return _int_in(text, 0, INT64_MAX, "an integer >= 0 (at most 2**63-1)")


def positive_ints(text: str) -> list[int]:
    """Comma-separated positive integers (sizes, token counts), at least one."""
    values = [_int_in(x, 1, INT64_MAX, "comma-separated positive integers") for x in text.replace(" ", "").split(",")
              if x]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {_shown(text)}")
    return values


def seed(text: str) -> int:
    """A random seed torch and numpy both take: 0 .. 2**63-1."""
    return _int_in(text, 0, SEED_MAX, f"a seed from 0 to {SEED_MAX}")


def thread_count(text: str) -> int:
    """torch CPU threads: 1 .. 4 x this machine's CPUs."""
    high = max_threads()
    return _int_in(text, 1, high, f"a thread count from 1 to {high} ({THREADS_PER_CPU} x {cpu_count()} CPUs)")


def positive_float(text: str) -> float:
    """A finite number > 0 (nan and inf are refused: they pass every comparison test wrongly)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {_shown(text)}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {_shown(text)}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (a time in µs, a percentage)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {_shown(text)}")
    return value


def fraction(text: str) -> float:
    """A fraction in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {_shown(text)}")
    return value


def kv_scale(text: str) -> float:
    """A K/V scale: finite, > 0, and within float32's normal range, so its inverse is too."""
    value = positive_float(text)
    if not SCALE_MIN <= value <= SCALE_MAX:
        raise argparse.ArgumentTypeError(f"expected a scale from 2**-126 to 2**127 (float32 holds it and its "
                                         f"inverse), got {_shown(text)}")
    return value


def repeat_count(text: str) -> int:
    """Timed repeats of one measurement: 1 .. ``MAX_REPEATS``."""
    return _int_in(text, 1, MAX_REPEATS, f"a count from 1 to {MAX_REPEATS:,}")


def port_number(text: str) -> int:
    """A TCP port: 1 .. 65535."""
    return _int_in(text, 1, 65535, "a port from 1 to 65535")


def memory_gb(text: str) -> float:
    """A memory limit in GB: finite, > 0, at most ``MAX_MEMORY_GB``."""
    value = positive_float(text)
    if value > MAX_MEMORY_GB:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_MEMORY_GB} GB, got {_shown(text)}")
    return value


def memory_mb(text: str) -> int:
    """A size in MB (a pool): 1 .. the MB of ``MAX_MEMORY_GB`` (its bytes stay within int64)."""
    return _int_in(text, 1, MAX_MEMORY_GB << 10, f"a number of MB from 1 to {MAX_MEMORY_GB << 10}")


def output_folder(text: str) -> Path:
    """A folder to write into whose path the OS can take, with room for what goes inside it.

    Too long a path (a name over the filesystem's limit, or a whole path over PATH_MAX once a
    run's names are added) used to end in ENAMETOOLONG tracebacks, sometimes after folders
    were made.
    """
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a folder path, got {_shown(text)}")
    path = Path(os.path.abspath(os.path.expanduser(text)))
    name_max, path_max = _name_limits(path)
    for part in path.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise argparse.ArgumentTypeError(
                f"the folder name {part[:40]!r}... is {len(os.fsencode(part))} bytes; this filesystem takes {name_max}")
    length = len(os.fsencode(str(path)))
    if length + OUTPUT_NAME_ROOM > path_max:
        raise argparse.ArgumentTypeError(
            f"the path is {length} bytes; with the {OUTPUT_NAME_ROOM} bytes a run's names need it would pass the "
            f"system's limit of {path_max}")
    return Path(text)


# what kvprof.core.atomic.temp_name adds to a file's name while it is written: ".", ".tmp-", a pid, "-", 8 hex
TEMP_NAME_ROOM = 1 + 5 + 10 + 1 + 8


def output_file(text: str) -> Path:
    """A file to write (``--perfetto``, ``--junit``, ``--html``) whose name and path the OS can take,
    with the room its temporary name needs: a name too long used to pass analysis and then fail
    when written (exit 6, where a path the system refuses is a bad argument, exit 2)."""
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a file path, got {_shown(text)}")
    path = Path(os.path.abspath(os.path.expanduser(text)))
    name_max, path_max = _name_limits(path)
    for part in path.parts[1:]:
        room = TEMP_NAME_ROOM if part == path.name else 0
        if len(os.fsencode(part)) + room > name_max:
            raise argparse.ArgumentTypeError(
                f"the name {part[:40]!r}... is {len(os.fsencode(part))} bytes; this filesystem takes {name_max}"
                + (f" (less {room} for the name it is written under first)" if room else ""))
    length = len(os.fsencode(str(path)))
    if length + TEMP_NAME_ROOM > path_max:
        raise argparse.ArgumentTypeError(f"the path is {length} bytes; the system's limit is {path_max}")
    return Path(text)


def _name_limits(path: Path) -> tuple[int, int]:
    """(longest file name, longest path) in bytes where ``path`` would be made (255, 4096 if unknown)."""
    existing = path
    while True:
        try:
            if existing.is_dir():
                break
        except OSError:
            pass
        if existing.parent == existing:
            break
        existing = existing.parent
    try:
        return os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return 255, 4096
