"""charts: the bench's pictures, drawn as SVG from the samples a run collects.

    flush-vs-rows.svg      one message flushed to a transcript of 10 ... 10,000 prior rows, ours against
                           upstream hermes-agent (log-log): the median of each point, its interquartile
                           range as a band
    recovery-latency.svg   every SIGKILL -> resumed model request cycle of the recovery section, fork
                           server against fresh interpreter, as empirical CDFs on a log time axis

The full bench (`python scripts/bench.py`) writes them to the checkout's docs/figures, where the
README shows them; `--charts DIR` elsewhere, `--no-charts` not at all; `--quick` draws none unless
`--charts` asks. Drawing needs matplotlib (the `bench` extra: ./scripts/setup bench in a checkout),
imported only here and only when a chart is drawn: without it the table is printed as ever and a
line says why there are no charts.

The sections hand their samples over in a `ChartData` kept with the run's `Report` (`collected`).
The flush series is a measurement of its own, run only when charts will be drawn (`ChartData.wanted`);
the recovery samples are the ones behind the table's medians.

Same data, same matplotlib, same fonts: same bytes. The SVG ids come from a fixed hash salt, text
stays text (svg.fonttype 'none') and no date is written.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.table import Report, median, percentile
from hermes.extras import install_line

FLUSH_SVG = "flush-vs-rows.svg"
RECOVERY_SVG = "recovery-latency.svg"
INSTALL_HINT = install_line("bench")
CHECKOUT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = CHECKOUT / "docs" / "figures"
SALT = "hermes-supervisor-bench"
COLORS = ("#1f6fb4", "#d9622b", "#4a9b4a", "#8a5fb8")  # ours first, then the others, in the order given
RC = {"svg.hashsalt": SALT, "svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9.5,
      "axes.spines.top": False, "axes.spines.right": False}


@dataclass
class ChartData:
    """What the sections collected for the charts (all timings as measured, no rounding)."""

    wanted: bool = False  # set when charts will be drawn: the flush series is measured only then
    # side label -> prior rows -> every flush sample (microseconds); the first side is ours
    flush: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    flush_note: str = ""  # how they were measured (or, with no samples, why not)
    # side label -> every kill -> resumed model request sample (milliseconds); the first is the fork server
    recovery: dict[str, list[float]] = field(default_factory=dict)
    recovery_note: str = ""


def collected(report: Report) -> ChartData:
    """The run's chart data, kept with its report so every section that has the report can add to it."""
    data = vars(report).get("chart_data")
    if data is None:
        data = ChartData()
        vars(report)["chart_data"] = data
    return data


# ---------------------------------------------------------------------------- the bench's hook
@dataclass
class Plan:
    directory: Path | None  # None: no charts this run, for `reason`
    reason: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--charts", type=Path, default=None, metavar="DIR",
                        help=f"write the SVG charts to DIR (default: {DEFAULT_DIR.relative_to(CHECKOUT)} of the "
                             f"checkout for the full bench, none for --quick; needs {INSTALL_HINT})")
    parser.add_argument("--no-charts", action="store_true", help="draw no charts (and skip the series behind them)")


def matplotlib_missing() -> str | None:
    """Why matplotlib cannot be used here, or None when it can."""
    try:
        import matplotlib  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); {INSTALL_HINT}"
    return None


def begin(report: Report, args: argparse.Namespace) -> Plan:
    """Decide, before the sections run, whether and where this run draws its charts."""
    explicit = getattr(args, "charts", None)
    if getattr(args, "no_charts", False):
        return Plan(None, "--no-charts")
    if explicit is None and getattr(args, "quick", False):
        return Plan(None, "--quick measures smoke sizes; --charts DIR draws them anyway")
    if explicit is None and not (CHECKOUT / "pyproject.toml").is_file():
        return Plan(None, "not run from a checkout; --charts DIR says where")
    missing = matplotlib_missing()
    if missing:
        return Plan(None, missing)
    collected(report).wanted = True
    return Plan(Path(explicit) if explicit is not None else DEFAULT_DIR)


def finish(report: Report, plan: Plan, out: TextIO | None = None) -> list[Path]:
    """Draw the charts the run has data for; print one line saying where they went, or why not."""
    out = out if out is not None else sys.stderr
    if plan.directory is None:
        print(f"bench: charts: none drawn ({plan.reason})", file=out, flush=True)
        return []
    try:
        written, skipped = write(collected(report), plan.directory)
    except Exception as exc:  # noqa: BLE001  (a chart must never cost the table)
        print(f"bench: charts: none drawn ({type(exc).__name__}: {exc})", file=out, flush=True)
        return []
    parts = [", ".join(_shown(p) for p in written) if written else "none drawn"]
    parts += [f"{name} not drawn ({why})" for name, why in skipped]
    print("bench: charts: " + "; ".join(parts), file=out, flush=True)
    return written


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def write(data: ChartData, directory: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """Draw every chart `data` has samples for into `directory`: (written paths, [(skipped name, why)])."""
    written: list[Path] = []
    skipped: list[tuple[str, str]] = []
    directory.mkdir(parents=True, exist_ok=True)
    if any(data.flush.values()):
        written.append(render_flush(data, directory / FLUSH_SVG))
    else:
        skipped.append((FLUSH_SVG, data.flush_note or "the upstream section did not run"))
    if any(data.recovery.values()):
        written.append(render_recovery(data, directory / RECOVERY_SVG))
    else:
        skipped.append((RECOVERY_SVG, data.recovery_note or "the recovery section did not run"))
    return written, skipped


# ---------------------------------------------------------------------------- drawing
def _new_figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Any, path: Path, title: str) -> Path:
    fig.savefig(path, format="svg", metadata={"Title": title, "Date": None})
    return path


def _plain_log_ticks(axis: Any, locate: bool = True) -> None:
    """Log-scale ticks at 1, 2, 5 x 10^k written as plain numbers (1,000 rather than 10^3), no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if locate:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _titles(fig: Any, ax: Any, title: str, note: str) -> None:
    """The chart's title, and under it how it was measured, small (wrapped by hand: the layout sees it)."""
    fig.suptitle(title, x=0.01, ha="left", fontweight="bold", fontsize=11)
    if note:
        ax.set_title(textwrap.fill(note, 118), loc="left", fontsize=7.5, color="#555555")


def _us(v: float) -> str:
    return f"{v:,.0f} µs" if v >= 100 else f"{v:.1f} µs"


def render_flush(data: ChartData, path: Path) -> Path:
    """Flush cost against prior rows, one line per side (median), its interquartile range as a band."""
    import matplotlib

    title = "Flushing one message as the transcript grows"
    with matplotlib.rc_context(RC):
        fig = _new_figure(7.2, 4.3)
        ax = fig.add_subplot()
        all_rows: set[int] = set()
        ends: list[tuple[str, list[int], list[float]]] = []
        for i, (label, points) in enumerate(data.flush.items()):
            rows = sorted(r for r, xs in points.items() if xs)
            if not rows:
                continue
            all_rows.update(rows)
            color = COLORS[i % len(COLORS)]
            mid = [median(points[r]) for r in rows]
            ax.fill_between(rows, [percentile(points[r], 0.25) for r in rows],
                            [percentile(points[r], 0.75) for r in rows], color=color, alpha=0.16, linewidth=0)
            ax.plot(rows, mid, marker="o", markersize=4.5, linewidth=1.8, color=color, label=label)
            ends.append((color, rows, mid))
        # Each line's value at both ends: on the left above the point for the higher line and below it for
        # the lower, on the right beside it (nudged apart the same way).
        for end in (0, -1):
            by_value = sorted(ends, key=lambda e: e[2][end])
            for rank, (color, rows, mid) in enumerate(by_value):
                up = rank == len(by_value) - 1
                dx, dy, ha = (0, 9 if up else -9, "center") if end == 0 else (8, 0 if len(ends) == 1 else
                                                                                (5 if up else -5), "left")
                ax.annotate(_us(mid[end]), (rows[end], mid[end]), xytext=(dx, dy), textcoords="offset points",
                            ha=ha, va="center", fontsize=8.5, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted(all_rows)
        ax.set_xticks(ticks)
        _plain_log_ticks(ax.xaxis, locate=False)
        _plain_log_ticks(ax.yaxis)
        ax.set_xticks([], minor=True)
        ax.set_xlim(ticks[0] / 1.9, ticks[-1] * 2.8)
        ax.margins(y=0.15)
        ax.set_xlabel("rows already in the transcript")
        ax.set_ylabel("time to flush one message (µs)")
        _titles(fig, ax, title, data.flush_note)
        ax.grid(True, which="major", color="#d0d0d0", linewidth=0.6)
        fig.legend(loc="outside lower center", ncols=1, frameon=False)
        return _save(fig, path, title)


def render_recovery(data: ChartData, path: Path) -> Path:
    """Every kill -> resumed model request sample as an empirical CDF per pool kind, log time axis."""
    import matplotlib

    title = "SIGKILL to the resumed worker's model request"
    with matplotlib.rc_context(RC):
        fig = _new_figure(7.2, 4.0)
        ax = fig.add_subplot()
        for i, (label, samples) in enumerate(data.recovery.items()):
            xs = sorted(samples)
            if not xs:
                continue
            color = COLORS[i % len(COLORS)]
            n = len(xs)
            ys = [(k + 1) / n for k in range(n)]
            p50, p90 = percentile(xs, 0.5), percentile(xs, 0.9)
            ax.step([xs[0], *xs], [0.0, *ys], where="post", color=color, linewidth=1.8,
                    label=f"{label}: p50 {p50:,.1f} ms, p90 {p90:,.1f} ms (n={n})")
            ax.plot(xs, ys, "o", markersize=3.5, color=color)
            ax.axvline(p50, color=color, linestyle=":", linewidth=1.0)
        ax.set_xscale("log")
        every = [x for xs in data.recovery.values() for x in xs]
        ax.set_xlim(min(every) / 1.6, max(every) * 1.6)
        _plain_log_ticks(ax.xaxis)
        ax.set_ylim(0, 1.04)
        ax.set_xlabel("SIGKILL -> the resumed worker's model request at the server (ms, log scale)")
        ax.set_ylabel("fraction of cycles at or below")
        _titles(fig, ax, title, data.recovery_note)
        ax.grid(True, which="major", color="#d0d0d0", linewidth=0.6)
        fig.legend(loc="outside lower center", ncols=1, frameon=False)
        return _save(fig, path, title)
