"""``kvprof nsys -- CMD`` given a hostile command: one that starts with ``-`` (nsys would read it as
its own options) and one whose arguments and output hold tokens and secret values (they went to
``<base>.nsys.log`` as they were). The fake nsys of tests/test_nsys_command.py stands in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_nsys_command import SECRET, fake, kvprof_nsys  # noqa: F401  (fake: a fixture)

TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


@pytest.mark.parametrize("first", ["--env-var=INJECTED=1", "-o", "--", "-", "--output=/tmp/elsewhere"])
def test_a_command_starting_with_a_dash_is_refused(first: str, fake: Path, tmp_path: Path) -> None:  # noqa: F811
    base = tmp_path / "p"
    done = kvprof_nsys(fake, tmp_path, "--out", str(base), "--", first, sys.executable, "-c", "pass")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "must start with a program" in line or "no command to profile" in line
    assert not base.with_name("p.argv.json").exists() and not base.with_name("p.nsys.log").exists()


def test_tokens_in_the_commands_arguments_and_output_stay_out_of_the_log(fake: Path, tmp_path: Path) -> None:  # noqa: F811
    base = tmp_path / "q"
    # positional arguments: the fake nsys takes every "--" word for one of its own options
    child = [sys.executable, "-c", "import sys; print('argv', sys.argv[1:]); print('key', sys.argv[2])",
             "api-key", TOKEN, f"password:{SECRET}"]
    done = kvprof_nsys(fake, tmp_path, "--out", str(base), "--", *child)
    assert done.returncode == 0, done.stderr
    log = base.with_name("q.nsys.log").read_text()
    first = log.splitlines()[0]
    assert first.startswith("$ ") and " profile " in first and "api-key" in first  # redacted word by word
    assert TOKEN not in log and SECRET not in log
    assert TOKEN not in done.stderr and SECRET not in done.stderr  # the same lines on the terminal
    assert "[kvprof:" in log
    assert json.loads(base.with_name("q.argv.json").read_text())  # the command itself ran as given
