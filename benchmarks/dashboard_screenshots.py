"""Screenshots of every dashboard page and of the HTML report, on the committed samples, for docs.

    python benchmarks/dashboard_screenshots.py [--out docs/img/dashboard] [--width 760]

Starts ``kvprof dashboard`` on the bundled H200 samples (a free localhost port), visits each
page in Debian's headless Chromium through Playwright (never ``playwright install``), and
writes small PNGs (the top of each page, downscaled, 48-colour palette) plus
``report.png``: a screenshot of ``kvprof report --html`` of the samples -- the PNG export
of the landing view. Stops the server whatever happens.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import kvprof.api as kv
from kvprof.core.errors import ToolError

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "traces" / "samples"  # the real files (kvprof/samples links to them)
PAGES = ("Overview", "Timeline", "Distributions", "Sweeps", "Overlap", "Layer", "Compare runs")
CHROMIUM = os.environ.get("KVPROF_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def shrink(png: Path, width: int) -> None:
    from PIL import Image

    im = Image.open(png).convert("RGB")
    im = im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
    # 48 colours by octree: the pages' few flat colours stay exact, at about half the bytes of
    # 96 by median cut (docs/img stays small)
    im.quantize(colors=48, method=Image.Quantize.FASTOCTREE).save(png, optimize=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dashboard")
    ap.add_argument("--width", type=int, default=760, help="PNG width in pixels")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = kv.dashboard_server(SAMPLES / "h200-llama70b-tp8", env={**os.environ, "KVPROF_DASHBOARD_CACHE": tmp},
                                     cwd=ROOT)  # the sidebar names the traces root relative to this folder
        try:
            server.start().wait_healthy(120)
            report = Path(tmp) / "report.html"
            subprocess.run([sys.executable, "-m", "kvprof", "report", str(SAMPLES / "h200-llama70b-tp8"), "--html",
                            str(report)], check=True)
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                pg = b.new_page(viewport={"width": 1280, "height": 1100})
                pg.set_default_timeout(120_000)
                pg.goto(server.url)
                pg.wait_for_selector(".js-plotly-plot .main-svg")
                side = pg.locator('[data-testid="stSidebar"]')
                for name in PAGES:
                    side.get_by_text(name, exact=True).click()
                    pg.locator('[data-testid="stMain"] h3').filter(has_text=name.split()[0]).first.wait_for()
                    pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
                    pg.wait_for_timeout(2500)  # metrics and late charts
                    out = args.out / f"{name.split()[0].lower()}.png"
                    pg.screenshot(path=str(out))
                    shrink(out, args.width)
                pg.goto(report.as_uri())
                pg.wait_for_selector(".js-plotly-plot .main-svg")
                pg.wait_for_timeout(500)
                pg.screenshot(path=str(args.out / "report.png"), full_page=True)
                shrink(args.out / "report.png", args.width)
                b.close()
        except ToolError as exc:
            raise SystemExit(f"dashboard_screenshots: {exc}") from None
        finally:
            server.stop()
    total = sum(f.stat().st_size for f in args.out.glob("*.png"))
    print(f"{len(list(args.out.glob('*.png')))} PNGs in {args.out}, {total / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
