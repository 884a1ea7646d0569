"""Find Nsight Systems, run one profiled pass under it, and export the report to SQLite.

nsys is rarely on PATH (it may ship only inside the Nsight Compute bundle, one of ``INSTALL_GLOBS``), its
importer silently leaves only a ``.qdstrm`` when libdw/libelf are missing, and an
unbounded capture writes gigabytes. This module turns each of those into a ToolError
that says what is missing, and keeps the profile flags in one place (``PROFILE_FLAGS``).

nsys also stores the environment of every process it can read in /proc, not only the
profiled one. So a pass runs in its own PID namespace where the system allows it
(``isolation_prefix``): with the allowlisted environment (``kvprof.tools.envsafe``) the
.nsys-rep then holds no secret (docs/reliability.md, "Nsight Systems reports", has the
measurement).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import glob
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kvprof.core.atomic import atomic_path
from kvprof.core.errors import ToolError, TraceError, UsageError
from kvprof.core.rundir import RunDir
from kvprof.core.text import printable
from kvprof.tools import envsafe

logger = logging.getLogger("kvprof")

# Searched after KVPROF_NSYS and PATH, in this order; within one pattern newest first.
INSTALL_GLOBS: tuple[str, ...] = (
    "opt/nvidia/nsight-systems/*/bin/nsys",
    "opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "usr/local/cuda*/bin/nsys",
    "usr/local/cuda*/nsight-systems-*/bin/nsys",
    "opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
)

# Flags of every profiled pass. --sample/--cpuctxsw off and a capture range keep a tiny
# run at seconds and kilobytes instead of minutes and gigabytes (docs/observer-effect.md).
PROFILE_FLAGS: tuple[str, ...] = (
    "--sample=none",
    "--cpuctxsw=none",
    "--force-overwrite=true",
    "--export=none",
)
CAPTURE_RANGE_END = "--capture-range-end=stop"
EXPORT_FLAGS: tuple[str, ...] = ("export", "--type=sqlite", "--force-overwrite=true")

IMPORTER_FAILURE = "Unable to retrieve the importer version"
IMPORTER_LIBRARIES: tuple[str, ...] = ("libdw.so.1", "libelf.so.1")
_MISSING_LIB = re.compile(r"(lib[\w.+\-]+\.so[.\d]*): cannot open shared object file")
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")
_STANDARD_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


@dataclass(frozen=True)
class NsysResult:
    """A finished profiled pass: the report, its log, the command and how it went."""

    report: Path
    log: Path
    command: tuple[str, ...]
    returncode: int
    seconds: float
    isolated: bool = False  # ran in a private PID namespace (see isolation_prefix)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _version_key(path: str) -> tuple[int, ...]:
    """The first dotted number in the path (2025.3.1, cuda-12.4); () when none."""
    m = re.search(r"(\d+(?:\.\d+)+)", path)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def find_nsys(environ: Mapping[str, str] | None = None, root: Path = Path("/")) -> Path | None:
    """KVPROF_NSYS, then PATH, then the usual install folders (newest version first).

    A KVPROF_NSYS that does not name an executable is a ToolError, not a silent fallback.
    ``root`` is for tests (a fake filesystem).
    """
    env = os.environ if environ is None else environ
    explicit = env.get("KVPROF_NSYS")
    if explicit:
        path = Path(explicit)
        if not _executable(path):
            raise ToolError(f"KVPROF_NSYS={explicit}: not an executable file")
        return path
    on_path = shutil.which("nsys", path=env.get("PATH", ""))
    if on_path:
        return Path(on_path)
    for pattern in INSTALL_GLOBS:
        found = sorted(glob.glob(str(root / pattern)), key=_version_key, reverse=True)
        for candidate in found:
            if _executable(Path(candidate)):
                return Path(candidate)
    return None


def require_nsys(environ: Mapping[str, str] | None = None) -> Path:
    """find_nsys, or a ToolError saying where it was looked for."""
    path = find_nsys(environ)
    if path is None:
        raise ToolError(
            "Nsight Systems (nsys) not found: set KVPROF_NSYS to its path "
            "(looked on PATH and in /opt/nvidia/nsight-systems, /usr/local/cuda*, /opt/nvidia/nsight-compute)"
        )
    return path


def nsys_version(path: Path | str) -> str:
    """The version nsys reports (``2025.3.1.90-...``); ToolError if it does not run."""
    try:
        done = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=60, errors="replace"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"cannot run {path} --version: {exc}") from None
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise ToolError(f"{path} --version failed (exit {done.returncode}): {_last_line(text)}")
    m = re.search(r"version\s+(\S+)", text)
    return m.group(1) if m else _last_line(text)


def check_profiled_command(child_argv: Sequence[str]) -> None:
    """UsageError for a command nsys would not run as given: none, or a first word that starts with
    ``-`` (nsys reads it, and what follows, as its own options: ``--env-var=NAME=value`` reached it)."""
    if not child_argv or not child_argv[0]:
        raise UsageError("no command to profile")
    if child_argv[0].startswith("-"):
        raise UsageError(f"the command to profile must start with a program, not {printable(child_argv[0][:60])!r}: "
                         "nsys would read it as one of its own options")


def nsys_profile_command(
    nsys: Path | str,
    output_base: Path | str,
    child_argv: Sequence[str],
    *,
    trace: str = "cuda,nvtx",
    cuda_graph_trace: str | None = "node",
    capture_range: str | None = "cudaProfilerApi",
    duration: float | None = None,
) -> list[str]:
    """The ``nsys profile`` command line; ``output_base`` without ``.nsys-rep``.
    ``duration``: nsys stops collecting after that many seconds and ends the command (a server).
    A command whose first word starts with ``-`` is refused (UsageError): nsys would read it, and
    what follows, as its own options (``--env-var=NAME=value`` reached nsys)."""
    check_profiled_command(child_argv)
    cmd = [str(nsys), "profile", *PROFILE_FLAGS, f"--trace={trace}"]
    if cuda_graph_trace:
        cmd.append(f"--cuda-graph-trace={cuda_graph_trace}")
    if capture_range and capture_range != "none":
        cmd += [f"--capture-range={capture_range}", CAPTURE_RANGE_END]
    if duration is not None:
        cmd.append(f"--duration={duration:g}")
    cmd += [f"--output={output_base}", *child_argv]
    return cmd


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def _blame_line(stderr_tail: Sequence[str]) -> str:
    """The line that says why the child failed: its exception line, else stderr's last."""
    lines = [ln.strip() for ln in stderr_tail if ln.strip()]
    for ln in reversed(lines):
        if _EXCEPTION_LINE.match(ln):
            return ln
    return lines[-1] if lines else "(nothing on stderr)"


def missing_importer_libraries(env: Mapping[str, str]) -> list[str]:
    """Which of libdw.so.1 / libelf.so.1 the importer could not load with ``env``."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + list(_STANDARD_LIB_DIRS)
    missing = []
    for lib in IMPORTER_LIBRARIES:
        if any(Path(d, lib).exists() for d in dirs):
            continue
        if ctypes.util.find_library(lib.split(".so")[0][3:]):  # ldconfig's cache
            continue
        missing.append(lib)
    return missing


def isolation_prefix() -> list[str] | None:
    """``unshare`` arguments giving nsys a private PID namespace and /proc, or None.

    nsys stores the environment of every process it can read in /proc (the capture's
    parent, its shell, even a sibling ``tail``: docs/reliability.md), so the allowlisted
    child environment alone does not keep an .nsys-rep clean. In its own PID
    namespace nsys sees only itself and the child. Root gets a PID namespace; others a
    user namespace as well (where the kernel allows it). Probed once per call.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    tail = ["--pid", "--fork", "--mount-proc", "--kill-child"]
    candidates = [[unshare, *tail]] if os.geteuid() == 0 else []
    candidates.append([unshare, "--user", "--map-root-user", *tail])
    for prefix in candidates:
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return None


def redactor() -> Callable[[str], str]:
    """What a line of nsys's log goes through: scrub's rules for this environment (a token-shaped
    string, a secret value of this process's environment in any form scrub knows, ``NAME=value``
    of an environment-like name, home paths), so a command's arguments and output do not put a
    secret in ``<base>.nsys.log`` or on the terminal."""
    from kvprof.tools.scrub import Rules

    rules = Rules()

    def redact(line: str) -> str:
        body = line.rstrip("\r\n")
        return rules.scrub(body)[0] + line[len(body):]

    return redact


def _pump(
    stream: IO[str], log: IO[str], output: deque[str], lock: threading.Lock, tail: deque[str] | None,
    echo: IO[str] | None = None, redact: Callable[[str], str] = str,
) -> None:
    """Copy one pipe of nsys into the log line by line (and to ``echo``), keeping recent lines to diagnose;
    each line redacted first (``redactor``)."""
    for raw in iter(stream.readline, ""):
        line = redact(raw)
        with lock:
            log.write(line)
            log.flush()
            output.append(line)
            if echo is not None:
                echo.write(line)
                echo.flush()
        if tail is not None:
            tail.append(line)
    stream.close()


def run_nsys_pass(
    nsys: Path | str | None,
    output_base: Path | str,
    child_argv: Sequence[str],
    env: Mapping[str, str],
    timeout: float | None,
    *,
    isolate: bool | None = None,
    echo: IO[str] | None = None,
    check: bool = True,
    **profile_options: str | float | None,
) -> NsysResult:
    """Run ``child_argv`` under ``nsys profile`` with exactly ``env`` (the allowlisted
    environment: the report stores it). stdout and stderr go to ``<base>.nsys.log`` (and to
    ``echo``). ``isolate``: run nsys in its own PID namespace (``isolation_prefix``) so the
    report holds no other process's environment; None = when available, True = required.
    ``timeout``: seconds, None for none. ``check=False``: a non-zero exit that still left a
    report is returned (``returncode``), not raised. ToolError: nsys missing, importer
    failure, timeout, child failure, no report.
    """
    if nsys is None:
        nsys = require_nsys(env)
    if not _executable(Path(nsys)):
        raise ToolError(f"cannot run nsys at {nsys}: not an executable file")
    base, report, stream = _fresh_report_paths(output_base)
    log_path = base.with_name(base.name + ".nsys.log")
    cmd = nsys_profile_command(nsys, base, child_argv, **profile_options)  # type: ignore[arg-type]
    prefix = _isolation(isolate)
    if prefix:
        cmd = [*prefix, *cmd]
    start = time.monotonic()
    returncode, text, stderr_tail = _run_logged(nsys, cmd, env, log_path, timeout, echo)
    seconds = time.monotonic() - start
    if IMPORTER_FAILURE in text or (stream.exists() and not report.exists()):
        named = sorted(set(_MISSING_LIB.findall(text)) | set(missing_importer_libraries(env)))
        what = f"{', '.join(named)} not found" if named else "see the log"
        raise ToolError(
            f"the Nsight Systems importer failed, only {stream.name} was written: {what} "
            f"(put libdw.so.1 and libelf.so.1 on LD_LIBRARY_PATH; log: {log_path})"
        )
    if returncode != 0 and (check or not report.exists()):
        raise ToolError(
            f"nsys pass failed (exit {returncode}): {_blame_line(stderr_tail)} (log: {log_path})"
        )
    if not report.exists():
        raise ToolError(
            f"nsys wrote no report at {report} (did the profiled process call cudaProfilerStart? "
            f"log: {log_path})"
        )
    return NsysResult(report, log_path, tuple(cmd), returncode, seconds, isolated=bool(prefix))


def _fresh_report_paths(output_base: Path | str) -> tuple[Path, Path, Path]:
    """``(base, <base>.nsys-rep, <base>.qdstrm)``, the folder made and any old report or stream
    deleted (--force-overwrite semantics: a stale one would pass for new)."""
    base = RunDir.nsys_base_of(Path(output_base))
    base.parent.mkdir(parents=True, exist_ok=True)
    report, stream = RunDir.nsys_report_of(base), RunDir.nsys_stream_of(base)
    for stale in (report, stream):
        stale.unlink(missing_ok=True)
    return base, report, stream


def _isolation(isolate: bool | None) -> list[str] | None:
    """The PID-namespace prefix for nsys (``run_nsys_pass``'s ``isolate``): an error when it is
    required and missing, a warning when it is wanted and missing."""
    prefix = isolation_prefix() if isolate is not False else None
    if isolate and prefix is None:
        raise ToolError("cannot isolate nsys: `unshare --pid --mount-proc` is not available or not permitted here")
    if isolate is None and prefix is None:
        logger.warning(
            "nsys runs without a private PID namespace (unshare not permitted here): the .nsys-rep "
            "will hold the environment of your other processes; share only the scrubbed .sqlite"
        )
    return prefix


def _run_logged(nsys: Path | str, cmd: list[str], env: Mapping[str, str], log_path: Path, timeout: float | None,
                echo: IO[str] | None) -> tuple[int, str, deque[str]]:
    """Run ``cmd`` with its output copied to ``log_path`` (and ``echo``); stopped with its
    children on a timeout or Ctrl-C. Returns the exit code, the last lines of output and the
    last lines of stderr."""
    stderr_tail: deque[str] = deque(maxlen=50)
    output: deque[str] = deque(maxlen=2000)
    lock = threading.Lock()
    redact = redactor()
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        log.write("$ " + " ".join(redact(word) for word in cmd) + "\n")  # word by word: the rest stays readable
        try:
            proc = subprocess.Popen(
                cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
            )
        except OSError as exc:
            raise ToolError(f"cannot run nsys at {nsys}: {exc.strerror or exc}") from None

        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, log, output, lock, None, echo, redact), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, log, output, lock, stderr_tail, echo, redact),
                             daemon=True),
        ]
        for t in pumps:
            t.start()
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc, pumps)
            raise ToolError(f"nsys pass timed out after {timeout:g} s (log: {log_path})") from None
        except BaseException:  # Ctrl-C: do not leave nsys and its child running
            _kill_group(proc, pumps)
            raise
        for t in pumps:
            t.join(timeout=30)
    return returncode, "".join(output), stderr_tail


def _kill_group(proc: subprocess.Popen[str], pumps: Sequence[threading.Thread]) -> None:
    """Stop nsys and the child it started (its own session), politely then firmly."""
    for sig, wait in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # nsys gone, its child may not be: the group is ours (own session)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for t in pumps:
        t.join(timeout=5)


def _is_sqlite(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        return fh.read(16) == b"SQLite format 3\x00"


def complete_sqlite(path: Path) -> bool:
    """A whole SQLite file: the magic, and at least the pages its header says it has
    (a copy or an export cut short has fewer bytes than that)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(100)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return False
    if len(head) < 100 or head[:16] != b"SQLite format 3\x00":
        return False
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    return page >= 512 and pages > 0 and size >= page * pages


def export_sqlite(
    nsys: Path | str, rep_path: Path | str, out_path: Path | str, timeout: float = 600,
    env: Mapping[str, str] | None = None,
) -> Path:
    """``nsys export --type sqlite`` to a temporary name, renamed to ``out_path`` when
    complete (a reader never opens a half-written export). ``env``: the exporter's
    environment (default: this process's, cut down to kvprof's allow-list like a profiled
    child's: nothing of the user's reaches nsys)."""
    if env is None:
        env = envsafe.allowed_environment()
    rep, out = Path(rep_path), Path(out_path)
    if not rep.is_file():
        raise TraceError(f"{rep}: no such Nsight Systems report")
    with atomic_path(out, keep_suffix=True) as tmp:
        cmd = [str(nsys), *EXPORT_FLAGS, f"--output={tmp}", str(rep)]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                stdin=subprocess.DEVNULL, env=dict(env),
            )
        except FileNotFoundError:
            raise ToolError(f"cannot run nsys at {nsys}: not found") from None
        except OSError as exc:
            raise ToolError(f"cannot run nsys at {nsys}: {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            raise ToolError(f"nsys export of {rep} timed out after {timeout:g} s") from None
        appended = RunDir.nsys_sqlite_of(tmp)  # in case nsys adds its own suffix
        if not tmp.exists() and appended.exists():
            appended.replace(tmp)
        appended.unlink(missing_ok=True)
        ok = _is_sqlite(tmp)
        if done.returncode != 0 or not ok:
            why = _last_line(done.stderr + done.stdout)
            raise ToolError(
                f"nsys export of {rep} failed (exit {done.returncode}"
                f"{'' if ok else ', no SQLite file written'}): {why}"
            )
    return out


@contextlib.contextmanager
def exported(rep_path: Path | str, out_dir: Path | str | None = None) -> Iterator[Path]:
    """The SQLite export of a ``.nsys-rep``, for as long as the ``with`` block reads it.

    A complete ``<name>.sqlite`` beside the report, no older than it, is used as is; a
    truncated one never is. Else nsys (found by ``find_nsys``) exports it atomically into
    ``out_dir``, where it stays for the next read, or into a temporary folder that is
    removed when the block ends.
    """
    rep = Path(rep_path)
    sibling = RunDir.nsys_export_beside(rep)
    if complete_sqlite(sibling) and sibling.stat().st_mtime >= rep.stat().st_mtime:
        yield sibling
        return
    nsys = find_nsys()
    if nsys is None:
        raise ToolError(f"{rep.name}: nsys not found (set KVPROF_NSYS or put nsys on PATH), or pass the "
                        "exported .sqlite (nsys export --type sqlite)")
    if out_dir is not None:
        yield export_sqlite(nsys, rep, Path(out_dir) / sibling.name)
        return
    with tempfile.TemporaryDirectory(prefix="kvprof-export-") as tmp:
        yield export_sqlite(nsys, rep, Path(tmp) / sibling.name)
