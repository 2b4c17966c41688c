"""Campaign reports as text: the table printed at the end, junit.xml and report.md."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Mapping
from xml.sax.saxutils import escape, quoteattr

from supervisor.chaos.coverage import coverage_lines

if TYPE_CHECKING:
    from supervisor.chaos.runner import CaseResult

NOT_RUN_LISTED = 200  # planned cases that did not run, listed by id in report.md


def table(summary: dict[str, Any]) -> str:
    """Kill point x cases x violations, then the totals and every violation's repro."""
    rows = [("kill point", "hit", "cases", "violations")]
    for name, entry in summary["points"].items():
        hit = "yes" if entry["hit"] else ("-" if not entry["cases"] else "NO")
        rows.append((name, hit, str(entry["cases"]), str(entry["violations"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    faults = fault_rows(summary)
    if faults:
        lines += [f"fault {name}: {row}" for name, row in faults] + [""]
    if power_text(summary):
        lines += [f"power cuts {power_text(summary)}", ""]
    if summary.get("coverage"):
        lines += [*coverage_lines(summary["coverage"]), ""]
    store = store_text(summary)
    if store:
        lines += [store, ""]
    lines.append(_totals(summary))
    note = partial_note(summary)
    if note:
        lines.append(note)
    for name in summary.get("faults_unlanded") or []:
        lines.append(f"  fault never landed: {name}: {_skip_text(summary['faults'][name])}")
    for v in summary["violations"]:
        lines.append(f"  {v['invariant']} ({v['class']}): {v['case']}: {v['message']}\n    repro: {v['repro']}")
    for u in summary["unknown"]:
        lines.append(f"  not judged ({', '.join(u['reasons']) or 'unknown'}): {u['case']}: {u['message']}")
    return "\n".join(lines)


def verdict_word(summary: dict[str, Any]) -> str:
    """PASS; FAIL (a violation, a case not judged, a kill point not reached); or PARTIAL: the
    campaign was stopped before every planned case ran, and what ran has no violation."""
    if summary.get("ok"):
        return "PASS"
    if summary.get("complete") is False and not summary.get("violations"):
        return "PARTIAL"
    return "FAIL"


def partial_note(summary: dict[str, Any]) -> str | None:
    """One line saying that (and how) a report is partial, or None for a complete one."""
    if summary.get("complete") is not False:
        return None
    missing = summary.get("not_run") or []
    why = summary.get("interrupted")
    campaign = summary.get("campaign") or {}
    plan = "" if campaign.get("planned") is not None or campaign.get("shards") else \
        " (stopped before the plan was derived, so the cases after the fault-free runs are unknown)"
    return (f"PARTIAL report: {summary['cases']} case(s) ran, {len(missing)} planned case(s) did not"
            f"{f' (stopped by {why})' if why else ''}{plan}")


def store_text(summary: dict[str, Any]) -> str | None:
    """Where the campaign's workers kept their sessions, when not in SQLite files (the default)."""
    store = (summary.get("campaign") or {}).get("store")
    if store in (None, "sqlite"):
        return None
    return f"store {store}: each case a database of its own on a private server, judged through SQLite images of it"


def other_deaths_text(summary: dict[str, Any]) -> str:
    """Deaths the nemesis did not plan, by cause ("self 47, timeout 1"), or "none"."""
    deaths = summary.get("other_deaths") or {}
    return ", ".join(f"{cause} {n}" for cause, n in deaths.items()) or "none"


def classes_text(summary: dict[str, Any]) -> str:
    """Violations by class: "damage 2, contract 0" (and the durability cost once a level documents one)."""
    by_class = summary.get("violations_by_class") or {}
    shown = {"damage": 0, "contract": 0, **by_class}
    return ", ".join(f"{kind} {n}" for kind, n in shown.items() if n or kind in ("damage", "contract"))


def power_text(summary: dict[str, Any]) -> str | None:
    """What the campaign's power cuts did, or None without any."""
    power = summary.get("power") or {}
    if not power.get("cuts"):
        return None
    return (f"{power['cuts']} at synchronous {'/'.join(summary.get('synchronous') or ['FULL'])}: "
            f"{power.get('cuts_dropping', 0)} dropped unsynced writes ({power.get('dropped_writes', 0)} writes), "
            f"{power.get('torn', 0)} tore one, {power.get('rows_lost', 0)} row(s) lost")


def fault_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Each requested fault family with what became of it: "planned 12, landed 9, skipped 3"."""
    return [(name, f"planned {row['planned']}, landed {row['landed']}, skipped {row['skipped']}")
            for name, row in (summary.get("faults") or {}).items()]


def _skip_text(row: dict[str, Any]) -> str:
    why = row.get("why_skipped") or {}
    reasons = "; ".join(f"{reason} ({n})" for reason, n in why.items())
    return f"planned {row['planned']}, landed 0" + (f", skipped because: {reasons}" if reasons else "")


def _totals(summary: dict[str, Any]) -> str:
    reaimed = summary.get("reaimed", 0)
    never = summary.get("faults_unlanded") or []
    return (f"cases {summary['cases']}, kills landed {summary['kills']}, other deaths {other_deaths_text(summary)}, "
            f"no-kill cases {summary['no_kill']}, "
            f"{f'timers aimed again {reaimed}, ' if reaimed else ''}"
            f"{f'faults never landed {len(never)}, ' if never else ''}"
            f"violations {len(summary['violations'])} ({classes_text(summary)}), "
            f"not judged {len(summary['unknown'])}, verdict {verdict_word(summary)}")


def junit(results: list[CaseResult]) -> str:
    failures = sum(1 for r in results if r.verdict.valid is False)
    errors = sum(1 for r in results if r.verdict.valid not in (True, False))
    cases = []
    for r in results:
        body = ""
        if r.verdict.valid is False:
            text = "\n".join(f"{v.invariant}: {v.message}" for v in r.verdict.violations)
            body = f'<failure message={quoteattr(text[:200])}>{escape(text)}\nrepro: {escape(r.repro())}</failure>'
        elif r.verdict.valid is not True:
            why = ", ".join(r.verdict.reasons) or "unknown verdict"
            body = f'<error message={quoteattr(why)}>{escape(r.verdict.message)}\nrepro: {escape(r.repro())}</error>'
        cases.append(f'  <testcase classname={quoteattr(r.case.scenario)} name={quoteattr(r.case.case_id)} '
                     f'time="{r.seconds:.3f}">{body}</testcase>')
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuite name="hermes-chaos" tests="{len(results)}" failures="{failures}" errors="{errors}">\n'
            + "\n".join(cases) + "\n</testsuite>\n")


def markdown(summary: dict[str, Any]) -> str:
    lines = ["# Chaos campaign", "", f"Verdict: **{verdict_word(summary)}**: {_totals(summary)}.", ""]
    campaign = summary.get("campaign")
    if campaign:
        lines += [f"Campaign `{campaign.get('id')}`, {shard_text(campaign)}, plan `{campaign.get('plan_hash')}`, "
                  f"store `{campaign.get('store') or 'sqlite'}`.", ""]
    note = partial_note(summary)
    if note:
        lines += [f"**{note}.**", ""]
    faults = summary.get("faults") or {}
    if faults:
        lines += ["| fault | planned | landed | skipped | why skipped |", "| --- | --- | --- | --- | --- |"]
        for name, row in faults.items():
            why = "; ".join(f"{reason} ({n})" for reason, n in (row.get("why_skipped") or {}).items())
            lines.append(f"| `{name}` | {row['planned']} | {row['landed']} | {row['skipped']} | {why or '-'} |")
        lines.append("")
    never = summary.get("faults_unlanded") or []
    if never:
        lines += [f"**Faults asked for that never landed: {', '.join(f'`{n}`' for n in never)}.** "
                  "The campaign tested nothing of them, and fails.", ""]
    lines += ["| kill point | hit | cases | violations |", "| --- | --- | --- | --- |"]
    for name, e in summary["points"].items():
        lines.append(f"| `{name}` | {'yes' if e['hit'] else ('-' if not e['cases'] else 'NO')} | {e['cases']} | "
                     f"{e['violations']} |")
    if summary["violations"]:
        lines += ["", "## Violations", ""]
        for v in summary["violations"]:
            lines.append(f"- **{v['invariant']}** ({v['class']}) in `{v['case']}`: {v['message']}  \n"
                         f"  repro: `{v['repro']}`")
    if summary["unknown"]:
        lines += ["", "## Not judged", ""]
        for u in summary["unknown"]:
            lines.append(f"- `{u['case']}` ({', '.join(u['reasons']) or 'unknown'}): {u['message']}  \n"
                         f"  repro: `{u['repro']}`")
    missing = summary.get("not_run") or []
    if missing:
        lines += ["", "## Planned, not run", ""]
        lines += [f"- `{case_id}`" for case_id in missing[:NOT_RUN_LISTED]]
        if len(missing) > NOT_RUN_LISTED:
            lines.append(f"- ... and {len(missing) - NOT_RUN_LISTED} more (report.json lists every one)")
    if summary.get("coverage"):
        lines += ["", *_coverage_markdown(summary["coverage"])]
    if summary.get("shrunk"):
        lines += ["", *_shrunk_markdown(summary["shrunk"])]
    return "\n".join(lines) + "\n"


# Report text (drawn messages, reasons, descriptions) may hold anything: markup, pipes, newlines.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#~])")


def md_text(value: Any) -> str:
    """`value` as literal Markdown text on one line: HTML is escaped as entities (a renderer shows
    "<script>" as text), Markdown punctuation is backslash-escaped (a "|" never splits a table
    cell), and line breaks become spaces (one never ends a list item or a table row)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(_MD_SPECIAL.sub(r"\\\1", text).splitlines())


def md_code(value: Any) -> str:
    """`value` as a Markdown code span, fenced with more backticks than it holds (a code span shows
    its text verbatim: no entity or escape works inside one)."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def conversation_turns(conversation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each turn of a conversation's JSON (supervisor.chaos.conversation.Conversation.to_json) as
    it ran: a turn that repeats an earlier one sends that turn's message and gets its replies, so
    its message, tool rounds (the tools of each step) and answer are the earlier turn's."""
    turns = list(conversation.get("turns") or [])
    shown = []
    for index, turn in enumerate(turns):
        again = turn.get("repeat_of")
        source = turns[again] if isinstance(again, int) and 0 <= again < index else turn
        rounds = [[str(call[0]) for call in step.get("calls") or []] for step in source.get("steps") or []]
        shown.append({"index": index, "repeat_of": again if source is not turn else None,
                      "message": source.get("message", ""), "parts": bool(source.get("parts")), "rounds": rounds,
                      "answer": source.get("answer", "")})
    return shown


def _coverage_markdown(section: Mapping[str, Any]) -> list[str]:
    """The Coverage section: one row per feature, then the explorable features no case reached."""
    points = section.get("points") or []
    descriptions = section.get("descriptions") or {}
    unsupported = section.get("unsupported") or {}
    lines = ["## Coverage", "",
             f"{section.get('pairs_reached', 0)} of {section.get('pairs_possible', 0)} (feature, kill point) pairs "
             "reached by a landed kill after the feature had happened.", "",
             "| feature | description | cases | killed | kill points reached |", "| --- | --- | --- | --- | --- |"]
    for feature, row in (section.get("features") or {}).items():
        head = f"| {md_code(feature)} | {md_text(descriptions.get(feature, ''))} |"
        if feature in unsupported:
            lines.append(f"{head} - | - | not supported: {md_text(unsupported[feature])} |")
            continue
        # Counted as the text table counts them; which points, per feature, is report.html's matrix.
        lines.append(f"{head} {row.get('cases', 0)} | {row.get('killed', 0)} | "
                     f"{len(row.get('points') or {})} of {len(points)} |")
    unreached = section.get("unreached") or []
    lines += ["", f"Never reached by a case: {', '.join(md_code(f) for f in unreached)}." if unreached
              else "Every feature the target supports was reached by a case."]
    return lines


def rounds_text(rounds: list[list[str]], code: Callable[[str], str] = str) -> str:
    """A turn's tool rounds: the tools of each round, rounds apart by " | " (as `shrunk_lines` prints them)."""
    return " | ".join(code(", ".join(tools)) for tools in rounds) or "no tools"


def _shrunk_markdown(shrunk: list[Mapping[str, Any]]) -> list[str]:
    """The Minimal failing cases section: per shrink, its size and case, then each turn's tool rounds."""
    lines = ["## Minimal failing cases", ""]
    for entry in shrunk:
        spent = ", budget spent: it may shrink further" if entry.get("budget_spent") else ""
        lines.append(f"- **{md_text(entry.get('invariant'))}**: {entry.get('turns')} turn(s), {entry.get('calls')} "
                     f"call(s), {entry.get('kills')} kill(s), shrunk from {md_code(entry.get('from'))} "
                     f"({entry.get('cases_run')} cases run{spent})  ")
        lines.append(f"  minimal case: {md_code(entry.get('case'))}  ")
        lines.append(f"  kills: {md_code(entry['fault']) if entry.get('fault') else 'none (it fails without a kill)'}")
        for turn in conversation_turns(entry.get("conversation") or {}):
            again = f" (turn {turn['repeat_of']} again)" if turn["repeat_of"] is not None else ""
            lines.append(f"  - turn {turn['index']}{again}: {rounds_text(turn['rounds'], md_code)}; "
                         f"answer {md_text(repr(turn['answer']))}")
        if entry.get("repro"):
            lines.append(f"  - repro: {md_code(entry['repro'])}")
        if entry.get("regression_file"):
            lines.append(f"  - regression test: {md_code(entry['regression_file'])}")
    return lines


def shard_text(campaign: dict[str, Any]) -> str:
    shards = campaign.get("shards")
    if shards:
        return f"merged from {len(shards)} shard(s)"
    shard = campaign.get("shard") or [1, 1]
    return f"shard {shard[0]}/{shard[1]}"

