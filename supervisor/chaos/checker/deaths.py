"""Deaths, by cause: which worker deaths the nemesis planned and landed, and which it did not.

A case's `kills` count only the first kind; every other death is counted apart, by cause, so a
worker that dies for some other reason can never stand in for a kill that did not land.

    nemesis      the kill planned for that worker: it reported the planned probe hit as its last
                 word and died of SIGKILL (mode self: it killed itself there; mode external: the
                 supervisor killed it while it waited), or the supervisor's planned timer killed it;
                 and no other kill of it was recorded after the nemesis's (a worker that announced
                 its kill, then hung until the supervisor killed it for taking too long, died of
                 the timeout); or the interrupt planned for it: it reported the planned probe hit
                 with mode `interrupt` and ended on SIGINT (what it reported after, answering the
                 calls the interrupt cut off, is expected of it)
    self         SIGKILL while it ran a tool, with no kill announced (a tool that restarts its own
                 worker: the last thing the worker reported was that tool's effect)
    timeout      the supervisor killed it for taking too long
    power-cut    the supervisor killed it with the rest of its case when the power was cut
                 (`--faults power-loss`: the planned kill of another worker of the case landed)
    server-hang  the supervisor killed it while the nemesis held its server connection stopped
                 (`--faults pg-hang`: the worker waits on a stopped backend with no deadline of its own)
    unannounced  SIGKILL that neither the worker nor the supervisor announced (something outside)
    SIGxxx       any other signal (a crash)

Workers are the history's `exit` events and the `twin_run` events of twin recoveries (which carry
what the twin last reported, since a twin's own reports concern a copy and stay out of the history).
"""
from __future__ import annotations

import signal
from collections import Counter
from typing import Any, Sequence

NEMESIS, SELF, TIMEOUT, UNANNOUNCED, POWER_CUT = "nemesis", "self", "timeout", "unannounced", "power-cut"
SERVER_HANG = "server-hang"

# What a worker reports over its control channel; anything of these after a kill's report means
# the worker lived on past the kill it announced.
_REPORTS = frozenset({"hello", "probe", "ui", "effect", "outcome"})


def death_causes(events: Sequence[dict[str, Any]]) -> dict[int, str]:
    """incarnation -> why that worker died, for every worker of the case that died of a signal."""
    announced: dict[int, int] = {}     # incarnation -> index of the probe hit that announced its kill
    interrupted: set[int] = set()      # incarnations that announced their planned SIGINT
    kills: dict[int, str] = {}         # incarnation -> who the supervisor last recorded killing it
    last_report: dict[int, dict[str, Any]] = {}
    lived_on: set[int] = set()
    dead: dict[int, int] = {}          # incarnation -> signal
    for index, event in enumerate(events):
        kind, inc = event.get("type"), event.get("incarnation")
        if inc is None:
            continue
        if kind in _REPORTS:
            if inc in announced:
                lived_on.add(inc)
            last_report[inc] = event
            if kind == "probe" and event.get("kill") is True and event.get("mode") == "interrupt":
                interrupted.add(inc)
            elif kind == "probe" and event.get("kill") is True and event.get("mode") != "pause":
                announced.setdefault(inc, index)
        elif kind == "kill":
            # The last kill recorded is the one the worker died of: a worker that announced its
            # own kill (recorded as the nemesis's when announced) and then hung until the
            # supervisor's timeout killed it was killed by the timeout, not by the nemesis.
            kills[inc] = str(event.get("by"))
        elif kind in ("exit", "twin_run") and event.get("signal") is not None:
            dead[inc] = int(event["signal"])
            if kind == "twin_run" and event.get("last_report"):  # a twin's reports are not in the history
                last_report[inc] = event["last_report"]
    causes = {}
    for inc, signum in dead.items():
        by = kills.get(inc)
        if signum == signal.SIGINT and inc in interrupted and by == "self":
            causes[inc] = NEMESIS
        elif signum != signal.SIGKILL:
            causes[inc] = _signal_name(signum)
        elif by in (TIMEOUT, POWER_CUT, SERVER_HANG):
            causes[inc] = by
        elif by == "timer" or (inc in announced and inc not in lived_on and by in ("self", "supervisor")):
            causes[inc] = NEMESIS
        elif (last_report.get(inc) or {}).get("type") == "effect":
            causes[inc] = SELF
        else:
            causes[inc] = UNANNOUNCED
    return causes


def count_deaths(events: Sequence[dict[str, Any]]) -> tuple[int, dict[str, int]]:
    """(kills the nemesis planned and landed, every other death counted by cause)."""
    causes = Counter(death_causes(events).values())
    landed = causes.pop(NEMESIS, 0)
    return landed, dict(sorted(causes.items()))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
