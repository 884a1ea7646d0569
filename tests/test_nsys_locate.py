"""Finding and running Nsight Systems, with fake ``nsys`` executables (no real nsys here).

Each fake is a small script that behaves like one nsys outcome: a report, the importer
failure some nsys installs show (only a .qdstrm), no report, a failing export. Like the real one, the
fake stores its whole environment in the report, so the allowlist is tested end to end.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvprof.core.errors import ToolError, TraceError
from kvprof.tools import nsys as nsysmod
from kvprof.tools.envsafe import child_environment
from kvprof.tools.nsys import (
    export_sqlite,
    find_nsys,
    missing_importer_libraries,
    nsys_profile_command,
    nsys_version,
    run_nsys_pass,
)

FAKE = '''#!{python}
import os, sqlite3, subprocess, sys
MODE = {mode!r}
args = sys.argv[1:]
if args[:1] == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0")
    sys.exit(0)
if args[:1] == ["profile"]:
    opts = [a for a in args[1:] if a.startswith("--")]
    child = args[1 + len(opts):]
    out = next(a.split("=", 1)[1] for a in opts if a.startswith("--output="))
    print("Collecting data...", flush=True)
    rc = subprocess.call(child)
    if MODE == "importer":
        open(out + ".qdstrm", "wb").write(b"raw")
        print("Importer error status: Unable to retrieve the importer version.", file=sys.stderr)
        print("libdw.so.1: cannot open shared object file: No such file or directory", file=sys.stderr)
        sys.exit(1)
    if MODE == "noreport":
        print("No reports were generated", file=sys.stderr)
        sys.exit(rc)
    with open(out + ".nsys-rep", "w") as fh:  # like nsys: the environment goes into the report,
        fh.write("\\n".join(k + "=" + v for k, v in os.environ.items()))
        for pid in os.listdir("/proc"):  # and so does that of every process it can read
            try:
                fh.write("\\n" + open("/proc/" + pid + "/environ").read().replace("\\0", "\\n"))
            except (OSError, ValueError):
                pass
    print("Generated:\\n    " + out + ".nsys-rep")
    sys.exit(rc)
if args[:1] == ["export"]:
    out = next(a.split("=", 1)[1] for a in args if a.startswith("--output="))
    if MODE == "exportfail":
        open(out, "wb").write(b"SQLite format 3\\x00 half")
        print("ERROR: Export failed: unsupported report version", file=sys.stderr)
        sys.exit(1)
    con = sqlite3.connect(out)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, ?)", (open(args[-1]).read()[:30],))
    con.commit()
    con.close()
    sys.exit(0)
sys.exit(2)
'''


def fake_nsys(folder: Path, mode: str = "ok") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nsys"
    path.write_text(FAKE.format(python=sys.executable, mode=mode))
    path.chmod(0o755)
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), **extra}


CHILD_OK = [sys.executable, "-c", "print('child ran')"]


# ---------------------------------------------------------------- finding nsys


def test_kvprof_nsys_wins(tmp_path: Path) -> None:
    exe = fake_nsys(tmp_path / "explicit")
    other = fake_nsys(tmp_path / "onpath")
    assert find_nsys({"KVPROF_NSYS": str(exe), "PATH": str(other.parent)}) == exe


def test_bad_kvprof_nsys_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="KVPROF_NSYS=.*not an executable"):
        find_nsys({"KVPROF_NSYS": str(tmp_path / "nope")})


def test_path_then_install_folders_newest_first(tmp_path: Path) -> None:
    root = tmp_path / "root"
    onpath = fake_nsys(tmp_path / "bin")
    assert find_nsys({"PATH": str(onpath.parent)}, root=root) == onpath
    assert find_nsys({"PATH": ""}, root=root) is None

    bundle = fake_nsys(root / "opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64")
    assert find_nsys({"PATH": ""}, root=root) == bundle  # where it is on the H200

    old_cuda = fake_nsys(root / "usr/local/cuda-12.4/bin")
    new_cuda = fake_nsys(root / "usr/local/cuda-12.10/bin")
    assert old_cuda.exists() and find_nsys({"PATH": ""}, root=root) == new_cuda  # 12.10 > 12.4

    fake_nsys(root / "opt/nvidia/nsight-systems/2024.6.2/bin")
    newest = fake_nsys(root / "opt/nvidia/nsight-systems/2025.3.1/bin")
    (root / "opt/nvidia/nsight-systems/2026.1.0/bin").mkdir(parents=True)  # no nsys inside
    assert find_nsys({"PATH": ""}, root=root) == newest


def test_not_executable_is_skipped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    plain = root / "opt/nvidia/nsight-systems/2025.3.1/bin/nsys"
    plain.parent.mkdir(parents=True)
    plain.write_text("not executable")
    if os.geteuid() == 0 and os.access(plain, os.X_OK):
        pytest.skip("root may execute anything")
    assert find_nsys({"PATH": ""}, root=root) is None


def test_nsys_version(tmp_path: Path) -> None:
    assert nsys_version(fake_nsys(tmp_path)) == "2025.3.1.90-253135822126v0"
    with pytest.raises(ToolError, match="cannot run"):
        nsys_version(tmp_path / "missing")


def test_profile_command_flags() -> None:
    cmd = nsys_profile_command("/x/nsys", "/runs/r/pass", ["python", "-m", "kvprof.child"])
    assert cmd == [
        "/x/nsys", "profile", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
        "--export=none", "--trace=cuda,nvtx", "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--output=/runs/r/pass",
        "python", "-m", "kvprof.child",
    ]
    whole = nsys_profile_command("nsys", "o", ["a"], capture_range=None, cuda_graph_trace=None, trace="cuda")
    assert "--capture-range=cudaProfilerApi" not in whole and "--trace=cuda" in whole
    assert not any(a.startswith("--cuda-graph-trace") for a in whole)


# ---------------------------------------------------------------- running a pass


def test_pass_success_report_holds_only_the_allowlisted_env(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "tool")
    secret = secrets.token_hex(20)
    base = {**_env(tmp_path), "KVPROF_TEST_SECRET": secret, "HF_TOKEN": "hf_" + secrets.token_hex(12),
            "CUDA_MODULE_LOADING": "LAZY"}
    result = run_nsys_pass(nsys, tmp_path / "run" / "pass", CHILD_OK, child_environment(base), timeout=60,
                           isolate=False)

    assert result.report == tmp_path / "run" / "pass.nsys-rep" and result.returncode == 0
    stored = result.report.read_text()
    assert "CUDA_MODULE_LOADING=LAZY" in stored and "PATH=" in stored  # the fake stored the env
    assert secret not in stored and "HF_TOKEN" not in stored and "KVPROF_TEST_SECRET" not in stored
    log = result.log.read_text()
    assert "child ran" in log and "Collecting data" in log and "--capture-range=cudaProfilerApi" in log
    assert result.command[1] == "profile" and result.seconds > 0 and not result.isolated


def test_importer_failure_names_the_missing_library(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "tool", "importer")
    with pytest.raises(ToolError) as info:
        run_nsys_pass(nsys, tmp_path / "pass", CHILD_OK, _env(tmp_path), timeout=60)
    text = str(info.value)
    assert "\n" not in text and "importer failed" in text and "pass.qdstrm" in text
    assert "libdw.so.1 not found" in text and "pass.nsys.log" in text


def test_missing_importer_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nsysmod, "_STANDARD_LIB_DIRS", ())
    monkeypatch.setattr(nsysmod.ctypes.util, "find_library", lambda name: None)
    assert missing_importer_libraries({}) == ["libdw.so.1", "libelf.so.1"]
    (tmp_path / "libdw.so.1").write_bytes(b"")
    assert missing_importer_libraries({"LD_LIBRARY_PATH": f"/nowhere:{tmp_path}"}) == ["libelf.so.1"]


def test_no_report(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "tool", "noreport")
    with pytest.raises(ToolError, match="wrote no report.*cudaProfilerStart"):
        run_nsys_pass(nsys, tmp_path / "pass", CHILD_OK, _env(tmp_path), timeout=60)


def test_child_failure_names_exit_code_and_error_line(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "tool")
    child = [sys.executable, "-c", "import sys; print('noise', file=sys.stderr); raise ValueError('bad variant')"]
    with pytest.raises(ToolError) as info:
        run_nsys_pass(nsys, tmp_path / "pass", child, _env(tmp_path), timeout=60)
    text = str(info.value)
    assert "\n" not in text and "exit 1" in text and "ValueError: bad variant" in text


def test_missing_nsys(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot run nsys.*not an executable"):
        run_nsys_pass(tmp_path / "nsys", tmp_path / "pass", CHILD_OK, _env(tmp_path), timeout=60)
    with pytest.raises(ToolError, match="not found: set KVPROF_NSYS"):
        run_nsys_pass(None, tmp_path / "pass", CHILD_OK, {"PATH": str(tmp_path)}, timeout=60)


def _running_with(token: str) -> list[int]:
    """Outer-namespace pids whose command line holds ``token``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
                if state != "Z":
                    pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@pytest.mark.parametrize("isolate", [False, None])
def test_timeout_stops_nsys_and_child(tmp_path: Path, isolate: bool | None) -> None:
    nsys = fake_nsys(tmp_path / "tool")
    token = f"kvprof-timeout-{secrets.token_hex(6)}"
    child = [sys.executable, "-c", "import time; time.sleep(60)", token]
    start = time.monotonic()
    with pytest.raises(ToolError, match="timed out after 2 s"):
        run_nsys_pass(nsys, tmp_path / "pass", child, _env(tmp_path), timeout=2, isolate=isolate)
    assert time.monotonic() - start < 20
    deadline = time.monotonic() + 5
    while _running_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running_with(token) == []


PARENT = """
import sys
from kvprof.tools.envsafe import child_environment
from kvprof.tools.nsys import run_nsys_pass
r = run_nsys_pass(sys.argv[1], sys.argv[2], [sys.executable, "-c", "pass"], child_environment(),
                  timeout=60, isolate=sys.argv[3] == "1")
print(r.isolated)
"""


@pytest.mark.skipif(nsysmod.isolation_prefix() is None, reason="no PID namespace for unprivileged users here")
def test_isolation_keeps_other_processes_environment_out(tmp_path: Path) -> None:
    """Measured on the H200: nsys stores the environment of every process it can read,
    the capture's own parent included. Mimicked by the fake; isolation keeps it out."""
    nsys = fake_nsys(tmp_path / "tool")
    secret = secrets.token_hex(20)
    parent_env = {**_env(tmp_path), "KVPROF_TEST_SECRET": secret,
                  "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for isolate, leaks in (("0", True), ("1", False)):
        base = tmp_path / f"pass{isolate}"
        done = subprocess.run([sys.executable, "-c", PARENT, str(nsys), str(base), isolate],
                              env=parent_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(isolate == "1")
        assert (secret in base.with_name(base.name + ".nsys-rep").read_text()) is leaks


def test_stale_report_is_not_taken_for_a_new_one(tmp_path: Path) -> None:
    (tmp_path / "pass.nsys-rep").write_text("old")
    nsys = fake_nsys(tmp_path / "tool", "noreport")
    with pytest.raises(ToolError, match="wrote no report"):
        run_nsys_pass(nsys, tmp_path / "pass", CHILD_OK, _env(tmp_path), timeout=60)


# ---------------------------------------------------------------- export


def test_export_sqlite_atomic(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "tool")
    rep = tmp_path / "pass.nsys-rep"
    rep.write_text("report body")
    out = export_sqlite(nsys, rep, tmp_path / "pass.sqlite")
    con = sqlite3.connect(out)
    assert con.execute("SELECT value FROM StringIds").fetchone() == ("report body",)
    con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pass.nsys-rep", "pass.sqlite", "tool"]


def test_export_failure_leaves_nothing(tmp_path: Path) -> None:
    nsys = fake_nsys(tmp_path / "tool", "exportfail")
    rep = tmp_path / "pass.nsys-rep"
    rep.write_text("report body")
    with pytest.raises(ToolError) as info:
        export_sqlite(nsys, rep, tmp_path / "pass.sqlite")
    text = str(info.value)
    assert "\n" not in text and "exit 1" in text and "unsupported report version" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pass.nsys-rep", "tool"]


def test_export_missing_report_or_tool(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such Nsight Systems report"):
        export_sqlite(fake_nsys(tmp_path / "tool"), tmp_path / "none.nsys-rep", tmp_path / "x.sqlite")
    rep = tmp_path / "pass.nsys-rep"
    rep.write_text("r")
    with pytest.raises(ToolError, match="cannot run nsys"):
        export_sqlite(tmp_path / "missing-nsys", rep, tmp_path / "x.sqlite")
    assert not (tmp_path / "x.sqlite").exists()



def test_isolation_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(nsysmod, "isolation_prefix", lambda: None)
    nsys = fake_nsys(tmp_path / "tool")
    with pytest.raises(ToolError, match="cannot isolate nsys"):
        run_nsys_pass(nsys, tmp_path / "a", CHILD_OK, _env(tmp_path), timeout=60, isolate=True)
    with caplog.at_level("WARNING", logger="kvprof"):
        result = run_nsys_pass(nsys, tmp_path / "b", CHILD_OK, _env(tmp_path), timeout=60)
    assert not result.isolated and "without a private PID namespace" in caplog.text
