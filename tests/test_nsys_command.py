"""``kvprof nsys -- CMD``: any command profiled with kvprof's allow-listed environment, exported and scrubbed.

A fake ``nsys`` stands in (no real one here): like the real one it stores the environment of
the process it profiles in the report and the export, and it records its own command line and
the exporter's environment so the tests can see what reached each. The regression: the SGLang
script and docs ran ``nsys profile`` with the user's whole environment.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.tools.envsafe import allowed
from kvprof.tools.scrub import Rules, check_path

REPO = Path(__file__).resolve().parents[1]
SECRET = "kvprof-planted-4e1d9b7a2c6f03"

FAKE = '''#!{python}
import json, os, sqlite3, subprocess, sys
args = sys.argv[1:]
if args[:1] == ["profile"]:
    opts = [a for a in args[1:] if a.startswith("--")]
    child = args[1 + len(opts):]
    out = next(a.split("=", 1)[1] for a in opts if a.startswith("--output="))
    json.dump(opts, open(out + ".argv.json", "w"))
    rc = subprocess.call(child)
    with open(out + ".nsys-rep", "w") as fh:
        fh.write("\\x00".join(k + "=" + v for k, v in os.environ.items()) + "\\x00")
    sys.exit(143 if any(o.startswith("--duration=") for o in opts) else rc)  # nsys ended it (SIGTERM)
if args[:1] == ["export"]:
    out = next(a.split("=", 1)[1] for a in args if a.startswith("--output="))
    json.dump(dict(os.environ), open(args[-1] + ".export-env.json", "w"))
    entries = [e for e in open(args[-1]).read().split("\\x00") if e]
    con = sqlite3.connect(out)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT)")
    con.execute("CREATE TABLE TARGET_INFO_SYSTEM_ENV (name TEXT NOT NULL, value TEXT NOT NULL)")
    con.execute("INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel')")
    con.execute("INSERT INTO StringIds VALUES (2, ?)", ("\\x00".join(entries) + "\\x00",))
    con.executemany("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                    [(e.split("=", 1)[0] + '="' + e.split("=", 1)[1] + '"',) for e in entries])
    con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES ('DeviceEnvironment', ?)", (";".join(entries),))
    con.commit()
    con.close()
    sys.exit(0)
sys.exit(2)
'''


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "tool" / "nsys"
    path.parent.mkdir()
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    return path


def kvprof_nsys(fake: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m kvprof nsys`` from a shell whose environment holds secrets and clutter."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "KVPROF_NSYS": str(fake), "KVPROF_TEST_SECRET": SECRET, "HF_TOKEN": "hf_" + SECRET.replace("-", ""),
           "CONTAINER_NAME": "box-4e1d9b", "CUDA_VISIBLE_DEVICES": "0", "KVPROF_SGLANG": "1"}
    return subprocess.run([sys.executable, "-m", "kvprof", "nsys", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


CHILD = [sys.executable, "-c", "import os; print('child sees', ','.join(sorted(os.environ)))"]


def test_command_gets_only_the_allow_list_and_the_export_is_scrubbed(fake: Path, tmp_path: Path) -> None:
    base = tmp_path / "prof" / "server"
    done = kvprof_nsys(fake, tmp_path, "--out", str(base), "--", *CHILD)
    assert done.returncode == 0, done.stderr
    seen = re.search(r"child sees (\S+)", done.stderr)  # the command's output reaches the terminal
    assert seen is not None
    names = set(seen.group(1).split(","))
    assert {"CUDA_VISIBLE_DEVICES", "KVPROF_SGLANG", "PATH"} <= names
    assert not names & {"KVPROF_TEST_SECRET", "HF_TOKEN", "CONTAINER_NAME"}
    report = base.with_name("server.nsys-rep").read_text()
    assert SECRET not in report and "box-4e1d9b" not in report
    exporter = json.loads(base.with_name("server.nsys-rep.export-env.json").read_text())
    assert all(allowed(k, v) for k, v in exporter.items()) and "KVPROF_TEST_SECRET" not in exporter
    sqlite = base.with_name("server.sqlite")
    assert "export:" in done.stdout and str(sqlite) in done.stdout
    (check,) = check_path(sqlite, rules=Rules({"KVPROF_TEST_SECRET": SECRET}, hostnames=[]))
    assert check.clean, check.line()
    con = sqlite3.connect(sqlite)
    rows = [v for (v,) in con.execute("SELECT value FROM META_DATA_CAPTURE")]
    device = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV").fetchone()[0]
    con.close()
    assert any(r.startswith("CUDA_VISIBLE_DEVICES=") for r in rows) and "HOME=" in device
    assert base.with_name("server.nsys.log").is_file()


def test_options_reach_nsys_and_pass_env_passes_a_variable(fake: Path, tmp_path: Path) -> None:
    base = tmp_path / "p"
    done = kvprof_nsys(fake, tmp_path, "--out", str(base), "--pass-env", "CONTAINER_NAME", "--duration", "30",
                       "--capture-range", "cudaProfilerApi", "--cuda-graph-trace", "none", "--", *CHILD)
    assert done.returncode == 0, done.stderr
    opts = json.loads(base.with_name("p.argv.json").read_text())
    assert "--duration=30" in opts and "--capture-range=cudaProfilerApi" in opts and "--trace=cuda,nvtx" in opts
    assert not any(o.startswith("--cuda-graph-trace") for o in opts)
    assert "box-4e1d9b" in base.with_name("p.nsys-rep").read_text()  # passed on purpose
    assert "ended the command after 30 s" in done.stderr  # nsys's 143 at the end of --duration is no failure


def test_a_failing_command_still_exports_and_gives_its_exit_code(fake: Path, tmp_path: Path) -> None:
    base = tmp_path / "f"
    done = kvprof_nsys(fake, tmp_path, "--out", str(base), "--", sys.executable, "-c", "raise SystemExit(3)")
    assert done.returncode == 3 and "exited with 3" in done.stderr
    assert base.with_name("f.sqlite").is_file()


def test_usage_errors_are_one_line(fake: Path, tmp_path: Path) -> None:
    done = kvprof_nsys(fake, tmp_path, "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no command to profile" in done.stderr
    done = kvprof_nsys(fake, tmp_path, "--out", str(tmp_path / "x"), "--pass-env", "BAD-NAME", "--", "true")
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_scripts_and_docs_run_nsys_only_through_kvprof() -> None:
    """gpu/*.sh and the docs profile with ``kvprof nsys``, never a bare ``nsys profile``."""
    bare = re.compile(r"""(?:\bnsys|\$\{?NSYS\}?|\$\{?KVPROF_NSYS\}?)"?\s+profile\b""")
    files = [*REPO.glob("gpu/*.sh"), *REPO.glob("docs/*.md"), REPO / "README.md"]
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
                 if bare.search(line) and not line.lstrip().startswith("#") and "`nsys profile`" not in line]
    assert offenders == []
    assert "-m kvprof nsys" in (REPO / "gpu" / "sglang_check.sh").read_text()
    assert "kvprof nsys" in (REPO / "docs" / "sglang.md").read_text()
