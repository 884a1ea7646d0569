"""The dashboard in a real headless Chromium: start it on a free localhost port, switch every
page, check that Plotly drew its charts, save screenshots under test-artifacts/dashboard/.

Needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium) and the playwright
package (its driver only: never `playwright install`). Skips with the reason when either is
missing; CI installs both, so there it runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard_support import REPO, dash_runs  # noqa: F401

pytestmark = pytest.mark.browser

CHROMIUM = Path(os.environ.get("KVPROF_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# page -> (heading it shows, charts it draws with the H200 run open)
PAGES = {
    "Overview": ("Overview · h200", 2),
    "Timeline": ("Timeline · h200", 1),
    "Distributions": ("Distributions · h200", 2),
    "Sweeps": ("Sweeps", 2),
    "Overlap": ("Overlap · h200", 3),
    "Compare runs": ("Compare runs", 2),
}


def _requirements() -> str | None:
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        return "streamlit is not installed (pip install -e '.[dashboard]')"
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install playwright; no browser download needed)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def app_url(dash_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = _requirements()
    if reason:
        pytest.skip(reason)
    port = _free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    env = {**os.environ, "KVPROF_DASHBOARD_ROOTS": str(dash_runs["h200"].parent),
           "KVPROF_DASHBOARD_RUN": str(dash_runs["h200"]),
           "KVPROF_DASHBOARD_CACHE": str(tmp_path_factory.mktemp("cache"))}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(REPO / "kvprof" / "dashboard" / "app.py"),
             "--server.headless", "true", "--server.address", "127.0.0.1", "--server.port", str(port),
             "--browser.gatherUsageStats", "false"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"streamlit did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def page(app_url: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 2200})
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def _settle(pg: object) -> None:
    """Wait until the script run is over (no 'Running...' status) and Plotly has drawn."""
    pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")  # type: ignore[attr-defined]
    pg.wait_for_timeout(300)  # type: ignore[attr-defined]


def _charts_drawn(pg: object, n: int) -> int:
    pg.wait_for_function(  # type: ignore[attr-defined]
        f"() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.querySelector('.main-svg')).length >= {n}")
    return int(pg.locator(".js-plotly-plot").count())  # type: ignore[attr-defined]


def test_every_page_renders_its_charts(page: object, app_url: str) -> None:
    pg = page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    pg.goto(app_url)  # type: ignore[attr-defined]
    pg.wait_for_selector(".js-plotly-plot")  # type: ignore[attr-defined]
    first = time.perf_counter() - t
    sidebar = pg.locator('[data-testid="stSidebar"]')  # type: ignore[attr-defined]
    for name, (heading, n_charts) in PAGES.items():
        sidebar.get_by_text(name, exact=True).click()
        pg.locator('[data-testid="stMain"] h3').filter(has_text=heading).first.wait_for()  # type: ignore[attr-defined]
        _settle(pg)
        assert _charts_drawn(pg, n_charts) >= n_charts, name
        assert pg.locator('[data-testid="stException"]').count() == 0, name  # type: ignore[attr-defined]
        pg.screenshot(path=str(ARTIFACTS / f"{name.split()[0].lower()}.png"))  # type: ignore[attr-defined]
        if name == "Timeline":  # bars really drawn: Plotly's bar points in the SVG
            assert pg.locator(".js-plotly-plot .barlayer .point").count() > 10  # type: ignore[attr-defined]
    print(f"first page with charts in {first:.1f} s")


def test_bad_upload_is_a_message_in_the_page(page: object, app_url: str, tmp_path: Path) -> None:
    pg = page
    pg.goto(app_url)  # type: ignore[attr-defined]
    pg.wait_for_selector(".js-plotly-plot")  # type: ignore[attr-defined]
    bad = tmp_path / "notes.json"
    bad.write_text("this is not a trace")
    pg.get_by_text("Upload a trace").click()  # type: ignore[attr-defined]
    pg.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(bad))  # type: ignore[attr-defined]
    err = pg.locator('[data-testid="stAlertContentError"]').filter(has_text="not a trace kvprof can read")  # type: ignore[attr-defined]
    err.first.wait_for()
    _settle(pg)
    assert pg.locator('[data-testid="stException"]').count() == 0  # type: ignore[attr-defined]
    assert _charts_drawn(pg, 2) >= 2  # the open run still shows
    pg.screenshot(path=str(ARTIFACTS / "bad-upload.png"))  # type: ignore[attr-defined]
