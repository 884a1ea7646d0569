"""The wheel: built, installed into a fresh venv, ``kvprof dashboard`` started from an empty folder
serves the bundled samples (and nothing of the current folder); ./traces, where capture writes,
is offered beside them once it exists."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path

import pytest

from kvprof.tools.background import BackgroundServer, free_port

pytestmark = pytest.mark.slow
pytest.importorskip("streamlit")

REPO = Path(__file__).resolve().parents[1]
SAMPLE_FILES = ("summary.json", "writes.parquet", "events.parquet", "manifest.json", "step_timings.json")
MAX_WHEEL_MB = 4


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only the wheel installed (--no-deps); this interpreter's packages visible after it."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO),
                          "-w", str(dist)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (whl,) = dist.glob("kvcache_profiler-*.whl")
    assert whl.stat().st_size < MAX_WHEEL_MB << 20, f"{whl.name} is {whl.stat().st_size / 2**20:.1f} MB"
    names = set(zipfile.ZipFile(whl).namelist())
    for f in SAMPLE_FILES:
        assert f"kvprof/samples/h200-llama70b-tp8/{f}" in names
    assert "kvprof/samples/h200-bench/bench.json" in names and "kvprof/dashboard/app.py" in names
    assert not any(n.endswith((".nsys-rep", ".sqlite", ".json.gz")) for n in names)  # no raw traces
    env_dir = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this interpreter's packages (streamlit, plotly, pandas ...) after the venv's own: offline, fast; a
    # plain path line does not run that folder's .pth files, so an editable kvprof there stays invisible
    Path(site, "zz_host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # without PYTHONPATH: a source folder on it holds the build's kvcache_profiler.egg-info, which pip
    # would take for the package installed already, and install nothing
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                          "--no-index", str(whl)], capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0, res.stderr[-2000:]
    return env_dir


def test_installed_kvprof_is_the_wheel_and_finds_its_samples(venv: Path, tmp_path: Path) -> None:
    code = ("import kvprof, kvprof.dashboard.data as d; print(kvprof.__file__); "
            "print([str(r) for r in d.configured_roots()]); print([e.rel for e in "
            "d.discover_runs(d.configured_roots()[0]) if e.analysed]); print([str(p) for p in "
            "d.discover_bench(d.configured_roots()[0])])")
    res = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("KVPROF_", "PYTHONPATH"))},
                         timeout=120)
    assert res.returncode == 0, res.stderr
    where, roots, runs, bench = res.stdout.strip().splitlines()
    assert where.startswith(str(venv))
    assert roots == repr([str(Path(where).parent / "samples")])  # one root: the package's, not the cwd
    assert runs == "['h200-llama70b-tp8']"
    assert "h200-bench/bench.json" in bench
    # where `kvprof capture` writes (./traces): offered beside the samples once it exists
    (tmp_path / "traces").mkdir()
    res = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("KVPROF_", "PYTHONPATH"))},
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1] == repr([str(Path(where).parent / "samples"), str(tmp_path / "traces")])


def test_kvprof_dashboard_from_an_empty_folder_serves_the_samples(venv: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPROF_", "PYTHONPATH"))}
    env["KVPROF_DASHBOARD_CACHE"] = str(tmp_path / "cache")
    log = tmp_path / "server.log"
    server = BackgroundServer([str(venv / "bin" / "kvprof"), "dashboard", "--port", str(port)], port, env=env,
                              cwd=empty, log=log)
    with server.running(limit_s=90) as url:
        with urllib.request.urlopen(url, timeout=10) as r:
            assert b"<div id=\"root\">" in r.read() or r.status == 200
        assert "samples" in log.read_text()  # the banner names the bundled samples root
        chromium = Path(os.environ.get("KVPROF_CHROMIUM", "/usr/bin/chromium"))
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            sync_playwright = None  # type: ignore[assignment]
        if chromium.is_file() and sync_playwright is not None:  # the page itself: the samples' run, drawn
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"])
                pg = b.new_page()
                pg.set_default_timeout(90_000)
                pg.goto(url)
                pg.locator('[data-testid="stMain"] h3').filter(has_text="Overview · h200-llama70b-tp8").first.wait_for()
                pg.wait_for_selector(".js-plotly-plot .main-svg")
                assert pg.locator('[data-testid="stException"]').count() == 0
                b.close()
        assert not any(empty.iterdir())  # nothing written where it was started
