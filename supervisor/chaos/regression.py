"""A shrunk case as a regression test: a standalone pytest file, and the replay it calls.

The file holds the minimal conversation (as JSON, ASCII-escaped so any content survives any
editor), its kill schedule as a fault label, and the target with its options. Its test replays
exactly that case against the target, real worker processes and real kills, and asserts that
the case was judged and the invariant holds. It fails while the bug is there and passes once it
is fixed; and it fails, saying so, when the kill it was written for no longer lands, or when the
checker could not judge the case (a verdict neither True nor False, or the invariant's own part
unknown), since a replay that killed nothing, or that nothing judged, tested nothing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from hermes.private_files import make_private_dirs, write_private
from supervisor.chaos.campaign import Campaign
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.conversation import Conversation
from supervisor.chaos.generator import Case
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.runner import CaseResult
from targetkit import registry


def replay(conversation: Mapping[str, Any], fault: str | None, *, target: str = registry.DEFAULT,
           target_options: Mapping[str, str] | None = None, faults: tuple[str, ...] = (),
           synchronous: str = "FULL", tools: str | None = None, workdir: Path | None = None) -> CaseResult:
    """Run one conversation under one kill schedule (a fault label; None: no kill) and judge it;
    `tools`: the user's own tools module the conversation calls (`chaos --tools`), imported as the
    campaign imported it, from the directory the replay runs in."""
    spec = Conversation.from_json(dict(conversation))
    config = CampaignConfig(scenarios=[], mode="generated", jobs=1, target=target, faults=tuple(faults),
                            target_options=tuple(sorted((target_options or {}).items())), synchronous=synchronous,
                            tools=tools, workdir=workdir, keep=workdir is not None)
    campaign = Campaign(config)
    campaign.open()
    try:
        name = campaign.add_conversation(spec)
        result = campaign.run_case(Case(name, Fault.parse(fault) if fault else None))
    finally:
        campaign.close()
    if result is None:
        raise RuntimeError("the replay was stopped before its case finished")
    return result


def failure(result: CaseResult, invariant: str, fault: str | None) -> str | None:
    """Why a replay fails its regression test, or None when it passes: its planned kills must all
    have landed, the checker must have judged the case (a verdict of True or False: a harness
    error or a lost ledger leaves it unknown, which tested nothing), and `invariant` itself must
    have been judged and held."""
    if fault is not None and (result.kills < 1 or result.no_kill):
        return "the kill this regression was written for did not land: it no longer tests what it did"
    if result.verdict.valid is not True and result.verdict.valid is not False:
        why = ", ".join(result.verdict.reasons) or str(result.verdict.valid)
        return f"the case was not judged ({why}): it tested nothing"
    if any(v.invariant == invariant for v in result.verdict.violations):
        return f"{invariant} does not hold"
    if result.verdict.valid is True:
        return None  # a case passes only when every invariant was judged and held
    # Another invariant failed: this one must still have been judged on its own.
    own = [p for p in result.verdict.parts if p.name == invariant]
    if not own or own[0].valid is not True:
        why = f"{own[0].valid}: {own[0].message}" if own else "it is not among the verdict's parts"
        return f"{invariant} was not judged ({why})"
    return None


def describe(result: CaseResult) -> str:
    """What a failing replay says: each violation, and how the case ran."""
    lines = [f"{result.case.case_id}: {result.verdict.valid} ({result.kills} kill(s) landed)"]
    lines += [f"  {v.invariant} ({v.kind}): {v.message}" for v in result.verdict.violations]
    if result.verdict.message:
        lines.append(f"  {result.verdict.message}")
    return "\n".join(lines)


_TEMPLATE = '''"""Regression: {invariant} on a minimal conversation.

Shrunk by hermes-supervisor from case {origin}
({turns} turn(s), {calls} tool call(s), {kills} kill(s); target {target}).
Replays the case against the target with its fixed kill schedule: it fails while the
bug is there, and passes once it is fixed (the case judged, every kill landed).{tools_note}
"""
import json

from supervisor.chaos.regression import describe, failure, replay

INVARIANT = {invariant!r}
FAULT = {fault!r}
TARGET = {target!r}
TARGET_OPTIONS = {options!r}
FAULTS = {faults!r}
SYNCHRONOUS = {synchronous!r}
TOOLS = {tools!r}
CONVERSATION = json.loads(r"""
{conversation}
""")


def {function}():
    result = replay(CONVERSATION, FAULT, target=TARGET, target_options=TARGET_OPTIONS, faults=FAULTS,
                    synchronous=SYNCHRONOUS, tools=TOOLS)
    why = failure(result, INVARIANT, FAULT)
    assert why is None, why + "\\n" + describe(result)
'''


def regression_text(*, invariant: str, origin: str, conversation: Conversation, fault: Fault | None,
                    config: CampaignConfig, function: str) -> str:
    calls = sum(len(s.calls) for t in conversation.turns for s in t.steps)
    kills = 0
    link = fault
    while link is not None:
        kills, link = kills + 1, link.then
    body = json.dumps(conversation.to_json(), ensure_ascii=True, indent=1, sort_keys=True)
    tools_note = (f"\nIts conversation calls your own tools ({config.tools}): run it from the directory the\n"
                  "campaign ran in, where that module is imported from.") if config.tools else ""
    return _TEMPLATE.format(invariant=invariant, origin=origin, turns=len(conversation.turns), calls=calls,
                            kills=kills, target=config.target, fault=fault.label() if fault else None,
                            options=dict(config.target_options), faults=tuple(config.faults),
                            synchronous=config.synchronous, tools=config.tools, tools_note=tools_note,
                            conversation=body, function=function)


def write_regression(directory: Path, file_name: str, text: str) -> Path:
    make_private_dirs(directory)
    path = Path(directory) / file_name
    write_private(path, text)
    return path
