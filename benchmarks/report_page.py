"""Open a report folder's REPORT.html in headless Chromium and check it against its REPORT.md: every heading
on the page, the capacity table's figures, the busy-machine line, every plot drawn, no console error. With
--screenshot, keep a picture of the page (docs/results/NAME/REPORT.png for a published run):

    python benchmarks/report_page.py results/cpu --screenshot docs/results/make-run-cpu/REPORT.png

Exit 1 with one line per problem; tests/test_html_report.py runs the same check on a simulated sweep."""
import argparse
import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

from batchlab.report.blocks import parse

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER_TIMEOUT_S = 180
PAGE_WIDTH_PX = 1280
PAGE_HEIGHT_PX = 12_000  # a make run page's length, near enough: the window is the picture


def browser() -> str | None:
    """Debian's chromium (or another Chromium) on PATH, None where there is none."""
    return next((found for b in BROWSERS if (found := shutil.which(b))), None)


def _chromium(exe: str, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                           "--virtual-time-budget=15000", *args, page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)


def _plain(text: str) -> str:
    """A Markdown or HTML text as the reader sees it: marks and tags dropped, entities and spaces unified."""
    text = re.sub(r"<[^>]+>", "", text.replace("**", "").replace("`", ""))
    return re.sub(r"\s+", " ", html.unescape(text)).strip()


def expected(markdown: str) -> dict[str, list[str]]:
    """What the page must show: the headings, the capacity table's cells, the ⚠ lines, the plots."""
    parts = parse(markdown)
    capacity = next((b for i, b in enumerate(parts) if b.rows is not None
                     and any(p.level and p.text == "Capacity" for p in parts[:i])), None)
    return {"heading": [_plain(b.text) for b in parts if b.level],
            "capacity figure": [_plain(c) for r in (capacity.rows if capacity else []) for c in r],
            "busy-machine line": [_plain(b.text) for b in parts if b.text.startswith("⚠")],
            "plot": [b.image for b in parts if b.image]}


def problems(dom: str, stderr: str, markdown: str) -> list[str]:
    """Every way the rendered page (`dom`) falls short of its REPORT.md, one line each ([] when none)."""
    found = []
    count = re.search(r'id="page-errors" data-count="(-?\d+)"', dom)
    if not count or count[1] != "0":
        found.append(f"page errors: {re.findall(r'id=.page-errors.[^>]*>([^<]*)', dom)} (count {count and count[1]})")
    found += [f"console: {line}" for line in stderr.splitlines() if re.search(r"CONSOLE.*(Uncaught|Error)", line)]
    headings = {_plain(h) for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", dom, re.S)}
    text = _plain(dom)
    want = expected(markdown)
    found += [f"heading missing: {h}" for h in want["heading"] if h not in headings]
    found += [f"capacity figure missing: {c}" for c in want["capacity figure"] if c not in text]
    found += [f"busy-machine line missing: {line[:60]}" for line in want["busy-machine line"] if line not in text]
    for plot in want["plot"]:
        drawn = re.search(rf'data-plot="{re.escape(plot)}".*?class="main-svg"', dom, re.S)
        if not drawn and f'alt="{plot}"' not in dom:
            found.append(f"plot not drawn: {plot}")
    return found


def check(folder: Path, screenshot: Path | None = None) -> list[str]:
    """Open folder/REPORT.html headless and list its problems; with `screenshot`, write the page's PNG."""
    exe = browser()
    if exe is None:
        return ["no headless browser: install Debian's chromium (apt-get install -y chromium)"]
    page = folder / "REPORT.html"
    done = _chromium(exe, page, "--dump-dom")
    if done.returncode:
        return [f"{exe} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        shot = _chromium(exe, page, f"--screenshot={screenshot.resolve()}",
                         f"--window-size={PAGE_WIDTH_PX},{PAGE_HEIGHT_PX}", "--hide-scrollbars")
        if shot.returncode or not screenshot.is_file():
            return [f"no screenshot written: {shot.stderr.strip().splitlines()[-1:]}"]
    return problems(done.stdout, done.stderr, (folder / "REPORT.md").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a report folder (REPORT.md and REPORT.html)")
    parser.add_argument("--screenshot", type=Path, help="write the page as a PNG here")
    args = parser.parse_args()
    found = check(args.folder, args.screenshot)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
