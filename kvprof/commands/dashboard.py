"""Open the dashboard (Streamlit + Plotly): variants, timeline, distributions, sweeps, overlap, runs.

RUN_DIR (optional) is a run folder to open first; its parent becomes the traces root
unless --root is given. Without it the dashboard opens the real H200 samples: those
bundled in the package (in a checkout, traces/samples), and offers traces/ where capture
writes (./traces of the current folder when it exists, and a checkout's); never the
current folder itself. Only files under the
traces roots are read; uploads are analysed from a temporary file outside them. Binds
127.0.0.1 unless --address says otherwise. Needs the dashboard extra:
pip install -e '.[dashboard]'. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvprof.commands.argtypes import MAX_MEMORY_GB, memory_mb, output_folder, port_number
from kvprof.core.errors import ToolError, UsageError
from kvprof.dashboard.settings import ENV_FLAGS, NAMED

DEFAULT_PORT = 8501
DEFAULT_MAX_UPLOAD_MB = 200
MAX_UPLOAD_MB = MAX_MEMORY_GB << 10  # Streamlit took any number, 10**30 too, and started anyway
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", nargs="?", default=None, help="run folder to open first (default: the samples)")
    parser.add_argument("--root", action="append", type=Path, default=None,
                        help="traces root the sidebar offers (repeatable; default: the H200 samples, ./traces "
                             "when it exists and a checkout's traces/)")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="port (default: %(default)s)")
    parser.add_argument("--address", default="127.0.0.1",
                        help="address to bind (default: %(default)s, this machine only)")
    parser.add_argument("--max-upload-mb", type=memory_mb, default=DEFAULT_MAX_UPLOAD_MB,
                        help="largest trace upload, MB (default: %(default)s)")
    parser.add_argument("--cache-dir", type=output_folder, default=None,
                        help="where analyze outputs of unanalysed runs and uploads go "
                             "(default: ~/.cache/kvprof/dashboard)")
    parser.add_argument("--open", action="store_true", help="open a browser tab too")


def app_path() -> Path:
    """The dashboard's Streamlit script, from the installed package (never the current folder)."""
    from importlib.resources import files

    p = Path(str(files("kvprof.dashboard").joinpath("app.py")))
    if not p.is_file():
        raise ToolError(f"{p} not found: the kvprof installation is incomplete (reinstall kvcache-profiler[dashboard])")
    return p


def check_address(address: str, port: int) -> None:
    """The address is an IP address or a name that resolves; else one line, before
    the server starts (it used to end in the server's socket.gaierror traceback)."""
    import socket

    try:
        socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UsageError(f"--address {address!r} does not resolve to an address to bind: {why}") from None


def streamlit_command(args: argparse.Namespace, app: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The ``streamlit run`` command line and environment for ``args`` (checked, nothing started)."""
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be 1..65535, got {args.port}")
    if not 0 < args.max_upload_mb <= MAX_UPLOAD_MB:
        raise UsageError(f"--max-upload-mb must be from 1 to {MAX_UPLOAD_MB}, got {args.max_upload_mb}")
    check_address(args.address, args.port)
    roots = [r.expanduser().resolve() for r in (args.root or [])]
    for r in roots:
        if not r.is_dir():
            raise UsageError(f"--root {r} is not a folder")
    env = dict(os.environ)
    if args.run_dir:
        run = Path(args.run_dir).expanduser().resolve()
        if not run.is_dir():
            raise UsageError(f"{args.run_dir} is not a folder (a run directory from kvprof capture, or traces)")
        if not roots:
            roots = [run.parent]
        elif not any(run == r or run.is_relative_to(r) for r in roots):
            raise UsageError(f"{run} is not under any --root ({', '.join(map(str, roots))})")
        env["KVPROF_DASHBOARD_RUN"] = str(run)
    if roots:
        env["KVPROF_DASHBOARD_ROOTS"] = os.pathsep.join(str(r) for r in roots)
    env["KVPROF_DASHBOARD_MAX_UPLOAD_MB"] = str(args.max_upload_mb)
    from kvprof.commands.report import page_flags

    names = page_flags()
    env[ENV_FLAGS] = json.dumps({field: names(field) for field in NAMED})  # the pages spell them as flags
    if args.cache_dir:
        env["KVPROF_DASHBOARD_CACHE"] = str(args.cache_dir.expanduser().resolve())
    cmd = [
        sys.executable, "-m", "kvprof.dashboard.serve", "run", str(app or app_path()),
        "--server.address", args.address, "--server.port", str(args.port),
        "--server.headless", "false" if args.open else "true",
        "--server.maxUploadSize", str(args.max_upload_mb),
        "--browser.gatherUsageStats", "false",
    ]
    return cmd, env


def _default_roots() -> str:
    """What the app opens without --root: the samples, then ./traces and a checkout's traces/."""
    from kvprof.dashboard.data import configured_roots

    return ", ".join(str(r) for r in configured_roots({}))


def run(args: argparse.Namespace) -> int:
    import importlib.util
    import signal
    import subprocess

    for mod in ("streamlit", "plotly"):
        if importlib.util.find_spec(mod) is None:
            raise ToolError(f"{mod} is not installed: pip install 'kvcache-profiler[dashboard]'")
    cmd, env = streamlit_command(args)
    if args.address not in LOOPBACK:
        print(f"kvprof dashboard: warning: binding {args.address} makes the dashboard reachable from other "
              "machines; it has no authentication", file=sys.stderr)
    host = f"[{args.address}]" if ":" in args.address else args.address
    print(f"kvprof dashboard: http://{host}:{args.port}  (roots: "
          f"{env.get('KVPROF_DASHBOARD_ROOTS') or _default_roots()}; Ctrl-C stops)", flush=True)
    proc = subprocess.Popen(cmd, env=env)

    from kvprof.core.interrupts import Interrupted

    def _terminate(signum: int, frame: object) -> None:  # SIGTERM to us must not orphan the server
        raise Interrupted

    signal.signal(signal.SIGTERM, _terminate)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
