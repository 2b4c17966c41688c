"""The campaign-at-scale proof of docs/scale.md: run its shards, merge them, store their figures
(``docs/figures/proof.json``), and render the block (the shard table, the merged totals, and what a
nightly of NIGHTLY_KILLS landed kills costs, sized from them).

    python scripts/figures.py store proof run DIR [--shard I ...] [--runs N] [--jobs J] [--no-faults]
        run the shards one after another into DIR/shard-I (each with its --faults of the rotation
        below), sampling the supervisor's RSS into DIR/shard-I.run.json
    python scripts/figures.py store proof DIR [--open-runs N] [--note TEXT] [--store PATH]
        merge DIR/shard-* into DIR/merged (timed), open the merged report.html in headless Chromium
        when there is one (`python -m bench.report_open`), store the figures

Everything the block shows comes from the shards' and the merged report.json (``cases``, ``kills``,
``no_kill``, ``reaimed``, ``violations``, ``unknown``, ``wall_seconds``, ``cycles_per_second``,
and, from reports that have them, ``other_deaths`` (every worker death the nemesis did not plan)
and ``faults`` (``{name: {"planned", "landed", "skipped"}}``)), from the ``run`` step's RSS samples
and from the merge's and the report's timings. Reports without ``other_deaths`` counted every
SIGKILL death in ``kills``: a store made from them says so (``"kill_count": "uncorrected"``) and so
does the block.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from docfigures.common import FIGURES, REPO, child_env, load_1m, read_json, write_json

STORE = FIGURES / "proof.json"
CAMPAIGN_ID = "proof-20k"
SHARDS = 4
RUNS = 20_000
JOBS = 2
# Each shard's --faults: one fault family per shard, the shards otherwise alike.
FAULTS = {1: "", 2: "http500,http429,truncate,not_json,empty_choices", 3: "readonly,corrupt,disk,twin-recovery",
          4: "concurrent-resume"}
RSS_AT_S = 40.0   # the supervisor's RSS once it runs steadily, against its RSS at the end
NIGHTLY_KILLS = 100_000
NIGHTLY_SHARDS = 8
MERGE_TIMEOUT_S = 3600.0
OPEN_TIMEOUT_S = 1800.0


def campaign_args(runs: int = RUNS, jobs: int = JOBS) -> list[str]:
    return ["--mode", "random", "--seed", "2026", "--runs", str(runs), "--kill-mode", "both", "--jobs", str(jobs)]


# ---------------------------------------------------------------------------- run
def run_shard(directory: Path, index: int, count: int = SHARDS, faults: str | None = None, runs: int = RUNS,
              jobs: int = JOBS) -> dict[str, Any]:
    """Run shard `index` of the proof into DIRECTORY/shard-INDEX; sample the supervisor's RSS; write
    DIRECTORY/shard-INDEX.run.json. A first SIGINT is passed on (the shard writes its partial report)."""
    import psutil

    faults = FAULTS.get(index, "") if faults is None else faults
    argv = ["chaos", *campaign_args(runs, jobs), "--shard", f"{index}/{count}", *(["--faults", faults] if faults else []),
            "--campaign-id", CAMPAIGN_ID, "--report", str(directory / f"shard-{index}")]
    record: dict[str, Any] = {"shard": [index, count], "faults": [f for f in faults.split(",") if f],
                              "command": "hermes-supervisor " + " ".join(argv), "date": time.strftime("%Y-%m-%d"),
                              "jobs": jobs, "cores": os.cpu_count(), "load_1m": [load_1m(), None]}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", *argv], cwd=REPO, env=child_env(),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    at, last = None, None
    try:
        me = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = me.memory_info().rss / 2**20
            except psutil.Error:
                break
            last = rss
            if at is None and time.monotonic() - started >= RSS_AT_S:
                at = rss
            time.sleep(1.0)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # the campaign's own first-signal stop: a partial report
    finally:
        try:
            proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is the recorded pid
            proc.wait()
    record.update(exit=proc.returncode, wall_seconds=round(time.monotonic() - started, 1),
                  supervisor_rss_mib=[round(at, 1) if at is not None else None, round(last, 1) if last else None])
    record["load_1m"][1] = load_1m()
    (directory / f"shard-{index}.run.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


# ---------------------------------------------------------------------------- store
def _count(report: dict[str, Any], key: str) -> int:
    value = report.get(key)
    return len(value) if isinstance(value, list) else int(value or 0)


def _deaths(report: dict[str, Any]) -> dict[str, int] | None:
    deaths = report.get("other_deaths")
    return None if deaths is None else {str(k): int(v) for k, v in sorted(deaths.items())}


def _faults(report: dict[str, Any]) -> dict[str, dict[str, int]] | None:
    faults = report.get("faults")
    if not isinstance(faults, dict):
        return None
    return {name: {k: int(f.get(k, 0)) for k in ("planned", "landed", "skipped")} for name, f in sorted(faults.items())}


def shard_figures(report: dict[str, Any], run: dict[str, Any] | None) -> dict[str, Any]:
    campaign = report.get("campaign") or {}
    return {"shard": list(campaign.get("shard") or (run or {}).get("shard") or []),
            "faults": list(campaign.get("faults") or []), "cases": report["cases"], "kills": report["kills"],
            "other_deaths": _deaths(report), "faults_count": _faults(report), "no_kill": report.get("no_kill"),
            "violations": _count(report, "violations"), "not_judged": _count(report, "unknown"),
            "complete": report.get("complete"), "wall_seconds": report.get("wall_seconds"),
            "cases_per_second": report.get("cycles_per_second"),
            "supervisor_rss_mib": (run or {}).get("supervisor_rss_mib"), "load_1m": (run or {}).get("load_1m"),
            "cores": (run or {}).get("cores"), "date": (run or {}).get("date")}


def figures_from_reports(merged: dict[str, Any], shards: list[tuple[dict[str, Any], dict[str, Any] | None]],
                         merge_seconds: float | None, report_open: dict[str, Any] | None,
                         html_bytes: int | None = None) -> dict[str, Any]:
    """The store's content, from the merged report.json, each shard's report.json (with its run record,
    when the `run` step wrote one), the merge's wall time and the report's open times."""
    campaign = merged.get("campaign") or {}
    options = campaign.get("options") or {}
    rows = sorted((shard_figures(r, run) for r, run in shards), key=lambda s: s["shard"])
    loads = [s["load_1m"] for s in rows if s["load_1m"]]
    cores = {s["cores"] for s in rows if s["cores"]}
    dates = sorted(s["date"] for s in rows if s["date"])
    runs = options.get("runs")
    jobs = next((run["jobs"] for _, run in shards if run and run.get("jobs")), JOBS)  # no run record: the default
    return {
        "date": dates[0] if dates else time.strftime("%Y-%m-%d"),
        "kill_count": "nemesis" if "other_deaths" in merged else "uncorrected",
        "campaign_id": campaign.get("id", CAMPAIGN_ID),
        "args": campaign_args(runs if runs is not None else RUNS, jobs),
        "machine": {"cores": cores.pop() if len(cores) == 1 else None,
                    "load_1m": [min(l[0] for l in loads), max(l[1] for l in loads)] if loads else None,
                    "where": None},
        "shards": rows,
        "merged": {"cases": merged["cases"], "baselines": len(campaign.get("baselines") or []),
                   "scenarios": len(options.get("scenarios") or []), "kills": merged["kills"],
                   "other_deaths": _deaths(merged), "faults": _faults(merged), "no_kill": merged.get("no_kill"),
                   "reaimed": merged.get("reaimed"), "violations": _count(merged, "violations"),
                   "not_judged": _count(merged, "unknown"), "ok": bool(merged.get("ok")),
                   "complete": bool(merged.get("complete")),
                   "html_mb": round(html_bytes / 1e6, 1) if html_bytes is not None else None},
        "merge_seconds": round(merge_seconds, 1) if merge_seconds is not None else None,
        "report_open": report_open,
    }


OPEN_LINE = re.compile(r"report\.html \(([\d.]+) MB\): ([\d.]+) s median .*?an empty page ([\d.]+) s;.*?\((\d+) runs")


def parse_open_line(line: str) -> dict[str, Any] | None:
    """`python -m bench.report_open`'s line as the store keeps it."""
    m = OPEN_LINE.search(line)
    if not m:
        return None
    return {"html_mb": float(m.group(1)), "report_seconds": float(m.group(2)), "empty_seconds": float(m.group(3)),
            "runs": int(m.group(4))}


def store_from_directory(directory: Path, open_runs: int = 3) -> dict[str, Any]:
    """Merge DIRECTORY/shard-* into DIRECTORY/merged (timed), open it in Chromium if there is one, read it all."""
    shard_dirs = sorted((d for d in directory.glob("shard-*") if d.is_dir()), key=lambda d: d.name)
    if not shard_dirs:
        raise SystemExit(f"proof: no shard-* directories in {directory}")
    merged_dir = directory / "merged"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "supervisor", "merge", str(merged_dir), *map(str, shard_dirs)],
                          cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=MERGE_TIMEOUT_S, check=False)
    merge_seconds = time.monotonic() - started
    if done.returncode == 2 or not (merged_dir / "report.json").is_file():
        raise SystemExit(f"proof: the merge was refused (exit {done.returncode}):\n{done.stderr[-3000:]}")
    report_open = None
    if open_runs > 0:
        opened = subprocess.run([sys.executable, "-m", "bench.report_open", str(merged_dir), "--runs", str(open_runs)],
                                cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=OPEN_TIMEOUT_S, check=False)
        report_open = parse_open_line(opened.stdout)
        if report_open is None:  # no browser, most often: the block then says nothing of the open time
            print(f"proof: the report's open time was not measured:\n{opened.stderr[-2000:]}", file=sys.stderr)
    shards = []
    for d in shard_dirs:
        run_file = d.with_name(d.name + ".run.json")
        shards.append((json.loads((d / "report.json").read_text(encoding="utf-8")),
                       json.loads(run_file.read_text(encoding="utf-8")) if run_file.is_file() else None))
    merged = json.loads((merged_dir / "report.json").read_text(encoding="utf-8"))
    html = merged_dir / "report.html"
    return figures_from_reports(merged, shards, merge_seconds, report_open,
                                html.stat().st_size if html.is_file() else None)


# ---------------------------------------------------------------------------- render
def _n(value: Any) -> str:
    return "–" if value is None else f"{value:,}"


def _deaths_text(deaths: dict[str, int], noun: str = "") -> str:
    """'3 (self 2, timeout 1)', with `noun` after the total when given."""
    parts = ", ".join(f"{kind} {n:,}" for kind, n in deaths.items() if n)
    return f"{sum(deaths.values()):,}{noun}" + (f" ({parts})" if parts else "")


def _article(n: int) -> str:
    """'A' or 'An' before a number said in English (an 8-case, an 11,000-case, an 18-case)."""
    lead = f"{n:,}".split(",")[0]
    return "An" if lead.startswith("8") or lead in ("11", "18") else "A"


def _faults_label(faults: list[str]) -> str:
    return f"`{','.join(faults)}`" if faults else "none"


def sizing(stored: dict[str, Any]) -> dict[str, float]:
    """What a nightly of NIGHTLY_KILLS landed kills costs, from the merged totals and the shards' walls."""
    merged = stored["merged"]
    kills_per_case = merged["kills"] / merged["cases"]
    cases = NIGHTLY_KILLS / kills_per_case
    shard_wall = sum(s["wall_seconds"] for s in stored["shards"])
    rate = merged["cases"] / shard_wall
    minutes = cases / rate / 60
    return {"kills_per_case": kills_per_case, "cases": cases, "shard_wall": shard_wall, "rate": rate,
            "minutes": minutes, "per_shard": minutes / NIGHTLY_SHARDS}



def render(stored: dict[str, Any]) -> str:
    merged, shards, machine = stored["merged"], stored["shards"], stored["machine"]
    corrected = stored["kill_count"] == "nemesis"
    count = len(shards)
    planned = merged["cases"] - merged["baselines"]
    jobs = stored["args"][stored["args"].index("--jobs") + 1]
    where = ", ".join(x for x in (machine.get("where"), machine.get("load_1m") and
                                  "1-minute load {:g}–{:g}".format(*machine["load_1m"])) if x)
    cores = f"{machine['cores']}-core " if machine.get("cores") else ""
    lines = [
             f"**{_article(planned)} {planned:,}-case proof.** {count} shards of one random campaign, each run on its "
             f"own with `--jobs {jobs}` on one {cores}machine{f' ({where})' if where else ''}, "
             f"{'`--faults` rotated across the shards' if any(s['faults'] for s in shards) else 'with no `--faults`'}"
             f", then merged; measured {stored['date']} with these commands (`python scripts/figures.py store proof "
             "run DIR` runs the shards, `python scripts/figures.py store proof DIR` merges them and stores what this "
             "paragraph shows):", "", "```sh",
             f"hermes-supervisor chaos {' '.join(stored['args'])} \\",
             f"  --shard I/{count} [--faults F] --campaign-id {stored['campaign_id']} --report shard-I",
             f"hermes-supervisor merge merged {' '.join(f'shard-{i}' for i in range(1, count + 1))}", "```", ""]
    if stored.get("note"):  # how this run differed from the commands above (stored by hand, with the figures)
        lines += [stored["note"], ""]
    if not corrected:
        lines += ["These figures were measured before the kill count was corrected: their `kills` counted every "
                  "worker death by SIGKILL, whether the nemesis planned it or not, so they hold other deaths too. "
                  "Stored again from a run of the commands above, this paragraph shows landed nemesis kills and "
                  "other deaths apart.", ""]
    split = any(s["other_deaths"] is not None for s in shards)
    head = ["shard", "`--faults`", "cases", *(["landed nemesis kills", "other deaths"] if split else []), "wall",
            "cases/s", f"supervisor RSS at {RSS_AT_S:.0f} s → end"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in shards:
        rss = s["supervisor_rss_mib"]
        cells = [f"{s['shard'][0]}/{s['shard'][1]}", _faults_label(s["faults"]), _n(s["cases"]),
                 *([_n(s["kills"]), _deaths_text(s["other_deaths"]) if s["other_deaths"] is not None else "–"]
                   if split else []),
                 f"{s['wall_seconds']:,.0f} s", f"{s['cases_per_second']:.2f}",
                 f"{rss[0]} → {rss[1]} MiB" if rss and None not in rss else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    if corrected:
        kills = (f"{merged['kills']:,} landed nemesis kills, "
                 f"{_deaths_text(merged['other_deaths'] or {}, ' other deaths')}")
    else:
        kills = f"{merged['kills']:,} kills (as counted then: every SIGKILL death)"
    merge_time = f" ({merged_s:,.0f} s)" if (merged_s := stored.get("merge_seconds")) is not None else ""
    verdict = "PASS" if merged["ok"] and merged["complete"] else ("PARTIAL" if not merged["complete"] else "FAIL")
    lines += ["", f"The merge{merge_time} reports {merged['cases']:,} cases over all {merged['scenarios']} scenarios "
                  f"(the {planned:,} planned and the {merged['baselines']} fault-free runs every shard derives its "
                  f"plan from, counted once), {kills}, {_n(merged['no_kill'])} no-kill cases, "
                  f"{_n(merged['reaimed'])} timers aimed again, {merged['violations']:,} violations, "
                  f"{merged['not_judged']:,} cases not judged: {verdict}."]
    opened = stored.get("report_open")
    if opened:
        lines[-1] += (f" The merged report.html ({opened['html_mb']} MB) reaches its DOM in headless Chromium in "
                      f"{opened['report_seconds']:.2f} s median against {opened['empty_seconds']:.2f} s for an empty "
                      f"page (`python -m bench.report_open merged --runs {opened['runs']}`: the report's own share "
                      f"is {opened['report_seconds'] - opened['empty_seconds']:.2f} s).")
    if merged.get("faults"):
        lines += ["", "The nemesis's faults over the merged campaign:", "",
                  "| fault | planned | landed | skipped |", "| --- | --- | --- | --- |",
                  *[f"| `{name}` | {f['planned']:,} | {f['landed']:,} | {f['skipped']:,} |"
                    for name, f in merged["faults"].items()]]
    size = sizing(stored)
    slowest = min(shards, key=lambda s: s["cases_per_second"])
    per_case = "landed nemesis kills" if corrected else "kills (as counted then)"
    slowest_text = (f"{slowest['shard'][0]}/{slowest['shard'][1]} "
                    f"{'under `--faults ' + ','.join(slowest['faults']) + '`' if slowest['faults'] else 'without faults'}"
                    f" at {slowest['cases_per_second']:.2f} cases/s")
    rotate = ": rotate its faults across more shards to even them out" if slowest["faults"] else ""
    lines += ["", f"**What a {NIGHTLY_KILLS:,}-kill nightly costs:** at {size['kills_per_case']:.2f} {per_case} per "
                  f"case that is about {round(size['cases'], -3):,.0f} cases; one {cores}runner did "
                  f"{merged['cases']:,} cases in {size['shard_wall']:,.0f} s of shard wall time "
                  f"({size['rate']:.1f} cases/s over the fault mix), so about {round(size['minutes'], -1):,.0f} "
                  f"runner-minutes: {NIGHTLY_SHARDS} shards of about {size['per_shard']:.0f} minutes each (the "
                  f"slowest shard, {slowest_text}, sets the wall time{rotate}), plus each job's install."]
    return "\n".join(lines)



def block() -> str:
    return render(read_json(STORE))


def store(argv: list[str]) -> None:
    """`run DIR ...` runs the shards; `DIR ...` merges them and stores the figures."""
    parser = argparse.ArgumentParser(prog="figures.py store proof")
    if argv[:1] == ["run"]:
        parser.add_argument("directory", type=Path)
        parser.add_argument("--shard", type=int, action="append", help="only these shards (repeatable; default all)")
        parser.add_argument("--runs", type=int, default=RUNS, help=f"planned cases of the whole campaign ({RUNS})")
        parser.add_argument("--jobs", type=int, default=JOBS, help=f"each shard's --jobs (default {JOBS})")
        parser.add_argument("--no-faults", action="store_true", help="no --faults on any shard (a smoke run)")
        args = parser.parse_args(argv[1:])
        args.directory.mkdir(parents=True, exist_ok=True)
        for index in args.shard or range(1, SHARDS + 1):
            record = run_shard(args.directory, index, faults="" if args.no_faults else None, runs=args.runs,
                               jobs=args.jobs)
            print(f"proof: shard {index}/{SHARDS} exited {record['exit']} after {record['wall_seconds']} s",
                  file=sys.stderr)
        return
    parser.add_argument("directory", type=Path)
    parser.add_argument("--open-runs", type=int, default=3, help="samples of the merged report's open time (0: skip)")
    parser.add_argument("--store", type=Path, default=STORE, help="where to store the figures")
    parser.add_argument("--note", default=None,
                        help="one paragraph saying how this run differed from the commands (shown above the table)")
    args = parser.parse_args(argv)
    stored = store_from_directory(args.directory, args.open_runs)
    if args.note:
        stored["note"] = args.note
    write_json(args.store, stored)
