"""The planned kills of a case, each accounted on its own: fired, landed, or why not.

A case's kill plan is a chain of faults (`Fault.then`), each aimed at one worker: the
`process`-th process started for turn `turn`. A kill is judged only by that worker's own
history, never by a hit of the same probe in another worker, so one kill that landed can
never stand in for another of the chain that did not (two kills at the same point of two
processes, or a kill aimed at a process that never started).

    probe   fired: the worker spawned for (turn, process) reported the n-th hit of the probe
            with `kill` True; landed: that worker then died of the nemesis's SIGKILL
            (cause "nemesis", supervisor.chaos.checker.deaths)
    timer   fired: the supervisor's timer sent SIGKILL to that worker; landed: it died of it
    pause   fired as a probe; landed: that worker was seen stopped while another took over
    interrupt  fired as a probe; landed: that worker then ended on its own SIGINT (a worker that
            swallowed the interrupt and went on is NO_KILL)

A kill that never fired is UNFIRED (its worker never started, or never reached the point); one
that fired, or whose timer went off, without killing is NO_KILL. Either leaves the case unjudged.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from supervisor.chaos.checker.deaths import NEMESIS, death_causes
from supervisor.chaos.checker.evidence import of_type
from supervisor.chaos.checker.verdict import NO_KILL, UNFIRED
from supervisor.chaos.nemesis import Fault


@dataclass(frozen=True, slots=True)
class PlannedKill:
    """One fault of a chain (its `then` dropped) and what became of it."""

    fault: Fault
    fired: bool
    landed: bool
    incarnations: tuple[int, ...] = ()  # the workers started for its (turn, process)
    hits: int = 0  # how often those workers hit its probe
    reason: str | None = None  # UNFIRED or NO_KILL when it did not land
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        f = self.fault
        return {"fault": f.label(), "kind": f.kind, "turn": f.turn, "process": f.process, "point": f.point,
                "fired": self.fired, "landed": self.landed,
                **({"reason": self.reason, "message": self.message} if not self.landed else {})}


def chain(planned: Fault | None) -> list[Fault]:
    """The faults of a plan, first to last, each on its own."""
    out = []
    while planned is not None:
        out.append(replace(planned, then=None))
        planned = planned.then
    return out


def planned_kills(events: Sequence[dict[str, Any]], planned: Fault | None) -> list[PlannedKill]:
    """Every fault of the plan, in order, judged by the history of the worker it was aimed at."""
    causes = death_causes(events)
    where: dict[tuple[int, int], list[int]] = {}
    for spawn in of_type(events, "spawn"):
        key = (_int(spawn.get("turn_index")), _int(spawn.get("process")))
        where.setdefault(key, []).append(_int(spawn.get("incarnation")))
    return [_judge(fault, tuple(where.get((fault.turn, fault.process), ())), events, causes)
            for fault in chain(planned)]


def _judge(fault: Fault, mine: tuple[int, ...], events: Sequence[dict[str, Any]],
           causes: dict[int, str]) -> PlannedKill:
    aimed = f"t{fault.turn}p{fault.process}"
    if not mine:
        return PlannedKill(fault, False, False, mine, 0, UNFIRED,
                           f"planned kill never fired: {fault.label()} (no worker was started as {aimed})")
    if fault.kind == "timer":
        sent = [e for e in of_type(events, "kill") if e.get("by") == "timer" and _int(e.get("incarnation")) in mine]
        if any(causes.get(_int(e.get("incarnation"))) == NEMESIS for e in sent):
            return PlannedKill(fault, True, True, mine)
        return PlannedKill(fault, bool(sent), False, mine, 0, NO_KILL,
                           f"no-kill: the timer kill {fault.label()} landed on no live worker "
                           "(it had exited before the timer fired, or died of something else)")
    probes = [e for e in of_type(events, "probe") if _int(e.get("incarnation")) in mine]
    fired = [e for e in probes if e.get("kill") is True and e.get("name") == fault.probe
             and str(e.get("n")) == str(fault.n)]  # n may have crossed JSON as a string
    hits = sum(1 for e in probes if e.get("name") == fault.probe)
    if not fired:
        return PlannedKill(fault, False, False, mine, hits, UNFIRED,
                           f"planned kill never fired: {fault.point} (the worker {aimed} hit that probe "
                           f"{hits} time(s))")
    killed = {_int(e.get("incarnation")) for e in fired}
    if fault.kind == "pause":
        landed = any(e.get("stopped") is True and _int(e.get("incarnation")) in killed
                     for e in of_type(events, "pause"))
        what = "was never seen stopped"
    else:
        landed = any(causes.get(inc) == NEMESIS for inc in killed)
        how = sorted({causes[inc] for inc in killed if inc in causes})
        what = f"did not die of it ({'it died of: ' + ', '.join(how) if how else 'it did not die of a signal'})"
    if landed:
        return PlannedKill(fault, True, True, mine, hits)
    return PlannedKill(fault, True, False, mine, hits, NO_KILL,
                       f"no-kill: {fault.point} fired at {aimed}, but the worker {what}")


def _int(value: Any) -> int:
    """Event fields may have crossed JSON as strings; an absent one matches nothing planned."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return -(1 << 30)
