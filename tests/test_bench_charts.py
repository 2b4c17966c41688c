"""The bench's charts: drawn from synthetic series as valid SVG, the same bytes for the same data, and
no charts (but a line saying why, and the table as ever) where matplotlib is missing. Nothing here
measures or asserts a timing."""
from __future__ import annotations

import argparse
import io
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import charts
from bench.table import Report

SVG = "{http://www.w3.org/2000/svg}"
ROWS = (10, 100, 1_000, 10_000)


def _needs_matplotlib() -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the `bench` extra): "
                                             "the charts cannot be drawn here")


def _synthetic(shift: float = 0.0) -> charts.ChartData:
    """Fixed series shaped like a real run's: ours flat, upstream growing with the rows."""
    ours = {n: [200.0 + shift + (k % 7) * 3.0 for k in range(40)] for n in ROWS}
    upstream = {n: [300.0 + 0.45 * n + (k % 5) * 9.0 for k in range(40)] for n in ROWS}
    return charts.ChartData(
        wanted=True, flush={"ours": ours, "upstream hermes-agent": upstream}, flush_note="synthetic flush series",
        recovery={"fork server": [22.0 + k * 0.8 for k in range(25)],
                  "fresh interpreter": [480.0, 505.5, 512.0, 560.25, 640.0]},
        recovery_note="synthetic recovery samples")


def _texts(path: Path) -> str:
    return " ".join(t.text or "" for t in ET.parse(path).getroot().iter(f"{SVG}text"))


def _hide_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every `import matplotlib...` fail as it does where it is not installed."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_the_charts_render_as_valid_svg(tmp_path: Path) -> None:
    _needs_matplotlib()
    written, skipped = charts.write(_synthetic(), tmp_path)
    assert skipped == []
    assert sorted(p.name for p in written) == sorted([charts.FLUSH_SVG, charts.RECOVERY_SVG])
    for path in written:
        root = ET.parse(path).getroot()
        assert root.tag == f"{SVG}svg", path
        assert _texts(path).strip(), f"{path.name} has no text elements"  # svg.fonttype 'none': text stays text
        raw = path.read_text(encoding="utf-8")
        assert "<dc:date>" not in raw, f"{path.name} carries a date"
    flush_text = _texts(tmp_path / charts.FLUSH_SVG)
    assert "upstream hermes-agent" in flush_text and "10,000" in flush_text
    recovery_text = _texts(tmp_path / charts.RECOVERY_SVG)
    assert "fork server" in recovery_text and "fresh interpreter" in recovery_text


def test_the_same_data_gives_the_same_bytes(tmp_path: Path) -> None:
    _needs_matplotlib()
    first, _ = charts.write(_synthetic(), tmp_path / "a")
    second, _ = charts.write(_synthetic(), tmp_path / "b")
    for a, b in zip(first, second, strict=True):
        assert a.name == b.name and a.read_bytes() == b.read_bytes(), a.name
    other, _ = charts.write(_synthetic(shift=40.0), tmp_path / "c")
    assert other[0].name == charts.FLUSH_SVG and other[0].read_bytes() != first[0].read_bytes()


def test_a_chart_without_samples_is_not_drawn_and_the_line_says_why(tmp_path: Path) -> None:
    _needs_matplotlib()
    report = Report()
    charts.collected(report).recovery = _synthetic().recovery  # as if the upstream section had not run
    out = io.StringIO()
    written = charts.finish(report, charts.Plan(tmp_path), out=out)
    assert [p.name for p in written] == [charts.RECOVERY_SVG]
    assert not (tmp_path / charts.FLUSH_SVG).exists()
    line = out.getvalue()
    assert f"{charts.FLUSH_SVG} not drawn (the upstream section did not run)" in line and charts.RECOVERY_SVG in line


def test_quick_and_no_charts_draw_nothing() -> None:
    for argv in (["--quick"], ["--no-charts"]):
        parser = argparse.ArgumentParser()
        parser.add_argument("--quick", action="store_true")
        charts.add_arguments(parser)
        report = Report()
        plan = charts.begin(report, parser.parse_args(argv))
        assert plan.directory is None and not charts.collected(report).wanted, argv
        out = io.StringIO()
        assert charts.finish(report, plan, out=out) == [] and "none drawn" in out.getvalue(), argv


def test_without_matplotlib_the_bench_says_so_and_prints_its_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    _hide_matplotlib(monkeypatch)
    missing = charts.matplotlib_missing()
    assert missing is not None and charts.INSTALL_HINT in missing
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    out_dir = tmp_path / "charts"
    # The cheapest section, asked for charts explicitly: the charts are refused, the table is not.
    rc = main(["--quick", "--only", "flush", "--dir", str(tmp_path), "--charts", str(out_dir)])
    captured = capsys.readouterr()
    assert rc == 0
    assert charts.INSTALL_HINT in captured.err and "scripts/setup bench" in captured.err, captured.err
    assert any(line.startswith("flush 1 msg") for line in captured.out.splitlines()), captured.out
    assert "error" not in captured.out.split("notes:")[0], captured.out
    assert not out_dir.exists() or not any(out_dir.iterdir())
