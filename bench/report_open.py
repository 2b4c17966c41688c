"""How long a campaign's report.html takes to open in headless Chromium, against an empty page.

    python -m bench.report_open REPORT_DIR [--runs N] [--chromium PATH]

Each sample is one headless Chromium run to the DOM after the page's script ran (`--dump-dom`),
so it includes the browser's own start; the empty page opened the same way, interleaved with
the report's samples, is that start, and the difference is what the report itself costs. The
view opened is the report's default one (its failing cases, else the first page of all cases).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--dump-dom")
TIMEOUT_S = 120.0


def open_seconds(chromium: Path, url: str) -> float:
    """Wall time of one headless Chromium run to the DOM of `url` (its process group is gone on return)."""
    profile = tempfile.mkdtemp(prefix="bench-chromium-")
    started = time.perf_counter()
    proc = subprocess.Popen([str(chromium), *FLAGS, f"--user-data-dir={profile}", url], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(TIMEOUT_S)
        return time.perf_counter() - started
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is the recorded pid
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_open", description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a --report directory (or a merged one)")
    parser.add_argument("--runs", type=int, default=5, help="samples of each page (default 5)")
    parser.add_argument("--chromium", type=Path, default=CHROMIUM, help=f"the browser (default {CHROMIUM})")
    args = parser.parse_args(argv)
    page = args.report / "report.html"
    if not page.is_file():
        parser.error(f"no report.html in {args.report}")
    if not os.access(args.chromium, os.X_OK):
        parser.error(f"{args.chromium} is not an executable browser (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        empty = Path(scratch) / "empty.html"
        empty.write_text("<!doctype html><title>empty</title>")
        report_s, empty_s = [], []
        for _ in range(max(1, args.runs)):
            empty_s.append(open_seconds(args.chromium, empty.as_uri()))
            report_s.append(open_seconds(args.chromium, page.resolve().as_uri()))
    size_mb = page.stat().st_size / 1e6
    report_med, empty_med = statistics.median(report_s), statistics.median(empty_s)
    print(f"report.html ({size_mb:.1f} MB): {report_med:.2f} s median to its DOM in headless Chromium; "
          f"an empty page {empty_med:.2f} s; the report's own share {report_med - empty_med:.2f} s "
          f"({args.runs} runs each, interleaved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
