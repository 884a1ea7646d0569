"""kvprof dashboard: compare KV-cache write variants from what ``python -m kvprof analyze`` wrote.

Start with ``python -m kvprof dashboard [RUN_DIR]`` (binds 127.0.0.1) or
``streamlit run dashboards/app.py [-- --root DIR [--root DIR2] [--run RUN_DIR]]`` from a checkout.
The sidebar picks a traces root (only those configured: KVPROF_DASHBOARD_ROOTS, default
traces/samples and traces), a run under it, the variants and the trace source, and takes
uploads. Pages: Overview, Timeline, Distributions, Sweeps, Overlap, Layer, Compare runs.
A page that fails shows one readable error; the sidebar and the other pages keep working.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

_SOURCE_ROOT = Path(__file__).resolve().parents[2]
# `streamlit run kvprof/dashboard/app.py` from a checkout puts only this folder on the path;
# an installed kvprof is importable already and nothing is added
if (_SOURCE_ROOT / "pyproject.toml").is_file() and str(_SOURCE_ROOT) not in sys.path:
    sys.path.insert(0, str(_SOURCE_ROOT))

import streamlit as st  # noqa: E402

from kvprof.core.errors import KvprofError  # noqa: E402
from kvprof.core.rundir import RunDir  # noqa: E402
from kvprof.dashboard import data, frames  # noqa: E402
from kvprof.dashboard.state import UPLOAD_PREFIX, Context  # noqa: E402
from kvprof.dashboard.ui import md  # noqa: E402
from kvprof.dashboard.views import compare, distributions, layer, overlap, overview, sweeps, timeline  # noqa: E402

PAGES: dict[str, Callable[[Context], None]] = {
    "Overview": overview.render,
    "Timeline": timeline.render,
    "Distributions": distributions.render,
    "Sweeps": sweeps.render,
    "Overlap": overlap.render,
    "Layer": layer.render,
    "Compare runs": compare.render,
}
SLUGS = {name.split()[0].lower(): name for name in PAGES}  # ?page=timeline

log = logging.getLogger("kvprof.dashboard")


def apply_script_args(argv: list[str]) -> None:
    """``streamlit run app.py -- --root R --run D``: the same as the environment variables."""
    if not argv or not argv[0].endswith("app.py"):
        return  # imported by a test runner: its argv is not ours
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--root", action="append")
    ap.add_argument("--run")
    ap.add_argument("--max-upload-mb")
    ns, _ = ap.parse_known_args(argv[1:])
    if ns.root:
        os.environ[data.ENV_ROOTS] = os.pathsep.join(ns.root)
    if ns.run:
        os.environ[data.ENV_RUN] = ns.run
    if ns.max_upload_mb:
        os.environ[data.ENV_MAX_UPLOAD_MB] = ns.max_upload_mb


def guarded(what: str, fn: Callable[..., None], *args: object) -> None:
    """Run a page; a failure becomes one st.error and the rest of the app keeps working."""
    try:
        fn(*args)
    except KvprofError as exc:
        st.error(f"{what}: {md(exc)}")
    except Exception as exc:  # a bug or an input nobody foresaw: readable, logged with its traceback  # noqa: BLE001
        log.exception("%s failed", what)
        st.error(f"{what} failed: {type(exc).__name__}: {md(exc)}. The other pages still work; the server log has "
                 "the details.")


@st.cache_data(show_spinner=False, ttl=5)
def _runs(root: str) -> list[data.RunEntry]:
    return data.discover_runs(Path(root))


def _handle_upload(f: object) -> None:
    """Analyse an upload once (per file id); remember the outcome so reruns do not repeat it."""
    ss = st.session_state
    done: dict[str, tuple[str, str]] = ss.setdefault("upload_results", {})
    uploads: dict[str, Path] = ss.setdefault("uploads", {})
    name = str(getattr(f, "name", "upload"))
    fid = str(getattr(f, "file_id", name))
    if fid not in done:
        limit = data.max_upload_bytes()
        size = int(getattr(f, "size", 0))
        if size > limit:
            done[fid] = ("error", f"{name} is {size / 2**20:.1f} MB; uploads are limited to {limit / 2**20:.0f} MB. "
                                  "Copy it under the traces root, or run `python -m kvprof analyze` on it and open "
                                  "the folder.")
        else:
            try:
                with st.spinner(f"Analysing {name} with kvprof analyze..."):
                    out = data.analyse_upload(name, f.getvalue(), limit)  # type: ignore[attr-defined]
                label = UPLOAD_PREFIX + name
                n = 2
                while label in uploads and uploads[label] != out:
                    label, n = f"{UPLOAD_PREFIX}{name} ({n})", n + 1
                uploads[label] = out
                done[fid] = ("ok", label)
                ss["nav_run"] = label  # open what was just uploaded (before the run select exists)
            except KvprofError as exc:
                done[fid] = ("error", f"{name}: {exc}")
            except Exception as exc:  # noqa: BLE001
                log.exception("upload %s failed", name)
                done[fid] = ("error", f"{name}: cannot analyse it ({type(exc).__name__}: {exc})")
    status, msg = done[fid]
    if status == "error":
        st.error(md(msg))
    else:
        st.success(f"analysed; open as “{md(msg)}”")


def _pick_root(roots: list[Path], first_run: Path | None) -> tuple[Path, list[data.RunEntry]]:
    """The traces root select (first the root holding the run asked for, else one with runs)
    and the runs under the chosen root."""
    ss = st.session_state
    if ss.get("nav_root") not in [str(r) for r in roots]:
        with_run = [r for r in roots if first_run and first_run.is_relative_to(r)]
        with_runs = [r for r in roots if _runs(str(r))]
        ss["nav_root"] = str((with_run or with_runs or roots)[0])
    root = Path(st.sidebar.selectbox("Traces root", [str(r) for r in roots], key="nav_root",
                                     format_func=data.root_label, help="only files under this folder are read"))
    return root, _runs(str(root))


def _pick_run(ctx: Context, root: Path, first_run: Path | None) -> str | None:
    """The run select: the page's ``run`` query, else the run asked for, else the first analysed one."""
    ss = st.session_state
    labels = ctx.labels()
    if not labels:
        return None
    if ss.get("nav_run") not in labels:
        q = str(st.query_params.get("run", ""))
        rel = None
        if first_run is not None and first_run.is_relative_to(root):
            rel = first_run.relative_to(root).as_posix() or "."
        analysed = next((e.rel for e in ctx.runs if e.analysed), None)  # open something readable first
        ss["nav_run"] = next((c for c in (q, rel, analysed) if c in labels), labels[0])
    entries = {e.rel: e for e in ctx.runs}
    label: str | None = st.sidebar.selectbox("Run", labels, key="nav_run",
                                             format_func=lambda lab: entries[lab].label if lab in entries else lab)
    return label


def _open_run(ctx: Context, run_label: str) -> None:
    """Open the run into ``ctx`` with its variant and source filters; an error instead when it
    cannot be read, and a warning when its summary is older than its traces."""
    sb = st.sidebar
    try:
        ctx.run = ctx.open(run_label)
        summary = ctx.run.summary()
        groups = ctx.run.groups()
        variants = frames.variants_in(summary, groups)
        ctx.variants = sb.multiselect("Variants", variants, default=variants, key=f"nav_variants::{run_label}")
        sources = frames.sources_in(groups, summary)
        if len(sources) > 1:
            ctx.source = sb.radio("Source", sources, horizontal=True, key=f"nav_source::{run_label}",
                                  help="reference: the same steps with no profiler attached, timed with CUDA "
                                       "events (what a step pays; the default); kineto: torch.profiler; "
                                       "nsys: Nsight Systems. Each profiler slows what it watches: the "
                                       "Overview page shows by how much.")
        elif sources:
            ctx.source = sources[0]
        if ctx.run.note:
            st.warning(f"{md(run_label)}: {md(ctx.run.note)}")
        if ctx.run.run_dir is not None:
            stale = data.stale_traces(ctx.run.run_dir)
            if stale:
                st.warning(f"{md(run_label)}: {RunDir.SUMMARY} is older than {md(', '.join(stale))}; re-run "
                           "`python -m kvprof analyze` on it for current numbers.")
    except KvprofError as exc:
        st.error(f"Cannot open {md(run_label)}: {md(exc)}")
        ctx.run = None
    except Exception as exc:  # noqa: BLE001
        log.exception("opening %s failed", run_label)
        st.error(f"Cannot open {md(run_label)}: {type(exc).__name__}: {md(exc)}")
        ctx.run = None


def sidebar() -> tuple[str, Context]:
    ss = st.session_state
    sb = st.sidebar
    sb.title("kvprof dashboard")
    if "nav_page" not in ss:
        ss["nav_page"] = SLUGS.get(str(st.query_params.get("page", "")).lower(), "Overview")
    page = sb.radio("Page", list(PAGES), key="nav_page")

    roots = data.configured_roots()
    first_run = data.initial_run()
    root, runs = _pick_root(roots, first_run)

    with sb.expander("Upload a trace", expanded=False):
        f = st.file_uploader(
            f"Kineto .json[.gz], nsys .sqlite or .nsys-rep (up to {data.max_upload_bytes() / 2**20:.0f} MB)",
            key="upload", help="analysed from a temporary file outside the traces root; nothing is written there")
        if f is not None:
            _handle_upload(f)
    uploads: dict[str, Path] = ss.setdefault("uploads", {})

    ctx = Context(root=root, runs=runs, uploads=uploads)
    run_label = _pick_run(ctx, root, first_run)
    if run_label is not None:
        _open_run(ctx, run_label)
    st.query_params["page"] = page.split()[0].lower()
    if run_label is not None:
        st.query_params["run"] = run_label
    return page, ctx


def main() -> None:
    st.set_page_config(page_title="kvprof dashboard", layout="wide")
    apply_script_args(sys.argv)
    page, ctx = sidebar()
    if ctx.root is not None and not ctx.runs and not ctx.uploads:
        if not ctx.root.is_dir():
            st.warning(f"The traces root {md(ctx.root)} does not exist.")
        else:
            st.warning(f"No runs under {md(ctx.root)}: it holds no run folder ({RunDir.MANIFEST}, traces or "
                       f"{RunDir.SUMMARY}). Capture one with `python -m kvprof capture`, open one with `python -m "
                       "kvprof dashboard RUN_DIR`, or upload a trace in the sidebar.")
    guarded(page, PAGES[page], ctx)


main()
