"""Liveness: every turn ends, what a worker says of its turn is true, a worker on broken storage
fails closed, and every planned fault landed.

turn-liveness, outcome-honesty, fails-closed and coverage: a case whose fault never landed
tested nothing, and is "unknown", never a pass.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from supervisor.chaos.checker.deaths import count_deaths
from supervisor.chaos.checker.evidence import DB, as_durable, of_type, turn_brief, unreadable
from supervisor.chaos.checker.kills import planned_kills
from supervisor.chaos.checker.trajectories import read_trajectories, trajectory_violations, unlogged_completions
from supervisor.chaos.checker.verdict import (
    COVERAGE,
    FAILS_CLOSED,
    OUTCOME_HONESTY,
    TURN_LIVENESS,
    UNFIRED,
    UNDETERMINED,
    UNKNOWN,
    Verdict,
    Violation,
    unknown_verdict,
    verdict_of,
)
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.scenarios import DEFAULT_MAX_RESTARTS, Expectation
from worker.protocol import EXIT_TURN_FAILED

MODEL_REQUEST = "model.request"  # the probe our runtime fires as it sends each model request


def turn_liveness(db: DB, events: Sequence[dict[str, Any]], expect: Expectation | None = None) -> Verdict:
    """Every turn ended ('done' or 'failed', a failure with its reason recorded being an honest end); the
    database holds exactly `expect.turns` turns; no turn needed more than `expect.max_restarts`
    resume spawns to get there; no worker hung until the supervisor killed it for taking
    too long (a `kill` by "timeout": a turn rescued from a hang still hung); and a turn the daemon
    ended (`turn_ended`: cancelled or given up) is durably failed with the daemon's reason, the
    store having taken the end without an error.
    """
    d = as_durable(db)
    if d.error:
        return unreadable(TURN_LIVENESS, d)
    violations = []
    for turn in d.turns:
        if turn["state"] not in ("done", "failed"):
            violations.append(Violation(TURN_LIVENESS, f"turn {turn['id']} never ended: it is still {turn['state']}",
                                        {"turn": turn_brief(turn)}))
        elif turn["state"] == "failed" and not (turn.get("error") or "").strip():
            violations.append(Violation(TURN_LIVENESS, f"turn {turn['id']} failed without a recorded reason",
                                        {"turn": turn_brief(turn)}))
    if expect is not None and len(d.turns) != expect.turns:
        violations.append(Violation(TURN_LIVENESS, f"expected {expect.turns} turn(s), the database holds {len(d.turns)}",
                                    {"turns": [turn_brief(t) for t in d.turns]}))
    limit = expect.max_restarts if expect is not None else DEFAULT_MAX_RESTARTS
    resumes = [e for e in of_type(events, "spawn") if e.get("command") == "resume"]
    per_turn = Counter(e.get("turn_id") for e in resumes)
    for turn_id, n in sorted(per_turn.items(), key=lambda item: str(item[0])):
        if n > limit:
            violations.append(Violation(TURN_LIVENESS, f"turn {turn_id} was resumed {n} times (limit {limit})",
                                        {"turn_id": turn_id, "spawns": [e for e in resumes if e.get("turn_id") == turn_id]}))
    states_by_id = {t["id"]: t for t in d.turns}
    for end in of_type(events, "turn_ended"):
        turn = states_by_id.get(end.get("turn_id"))
        if end.get("error"):
            violations.append(Violation(TURN_LIVENESS, f"the store could not end turn {end.get('turn_id')} as the "
                                                       f"daemon does: {end['error']}", {"event": end}))
        elif end.get("ended") and (turn is None or turn["state"] != "failed" or turn.get("error") != end.get("reason")):
            violations.append(Violation(TURN_LIVENESS, f"turn {end.get('turn_id')}, which the daemon ended, is not "
                                                       "durably failed with the daemon's reason",
                                        {"event": end, "turn": turn and turn_brief(turn)}))
    for hang in of_type(events, "kill"):
        if hang.get("by") == "timeout":
            violations.append(Violation(TURN_LIVENESS, f"worker {hang.get('incarnation')} hung until the supervisor "
                                                       "killed it for taking too long", {"event": hang}))
    states = Counter(t["state"] for t in d.turns)
    return verdict_of(TURN_LIVENESS, violations,
                      {"turns": len(d.turns), **{f"turns_{s}": n for s, n in sorted(states.items())},
                       "resumes": len(resumes), "max_resumes_per_turn": max(per_turn.values(), default=0)})


def outcome_honesty(db: DB, events: Sequence[dict[str, Any]], trajectories: Path | None = None, *,
                    counted_calls: bool = False) -> Verdict:
    """What a worker reports of a turn (its `outcome`, the result its caller gets) is true of the
    durable state: a turn reported completed is durably 'done' once the case is over, and a turn
    reported failed says why (`failure_reason`). A caller told "failed" of a turn that was answered,
    or "completed" of one that never durably ended, acts on a lie the transcript itself does not
    show; turn-liveness and answer-once judge only the store. A completion followed by a power cut
    at a level that documents losing the last commits (synchronous=NORMAL) is not held to it: that
    loss is power-cut-durability's to report. `trajectories`: the runtime's trajectory log, another
    report of each finished turn, held to the store the same way, and holding a line for each turn a
    worker reported finishing (checker.trajectories). A worker that ran and exited on its own
    reported how its turn ended before it did.
    `counted_calls`: the target promises that the model calls a worker reports for its turn
    (`api_calls`) are the requests it made for that turn, each announced by a `model.request` probe
    first (ours does): a caller that bills, limits or audits by that count must get the true one;
    and each such request was durably counted on its turn before it was made (`_uncounted_requests`).
    """
    d = as_durable(db)
    if d.error:
        return unreadable(OUTCOME_HONESTY, d)
    try:
        logged = read_trajectories(trajectories) if trajectories is not None else []
    except OSError as exc:
        return unknown_verdict(OUTCOME_HONESTY, f"cannot read the trajectory log {trajectories}: {exc}", UNDETERMINED)
    states = {t["id"]: t for t in d.turns}
    violations = []
    reported = 0
    events = list(events)
    lossy_cuts = [i for i, e in enumerate(events) if e.get("type") == "power_cut" and e.get("synchronous") != "FULL"]
    probes = [((e.get("incarnation"), (e.get("ctx") or {}).get("turn")), e.get("name")) for e in events
              if e.get("type") == "probe"]
    requests = Counter(key for key, name in probes if name == MODEL_REQUEST)
    # A worker that announced nothing of a turn has no probes to count its requests by (probes not
    # wired: coverage reports that), so its count is not judged.
    announced = {key for key, _name in probes}
    for index, event in enumerate(events):
        if event.get("type") != "outcome":
            continue
        result = event.get("result") or {}
        outcome, turn_id = result.get("outcome"), result.get("turn_id")
        if outcome not in ("completed", "failed"):
            continue
        reported += 1
        where = {"incarnation": event.get("incarnation"), "outcome": result}
        if outcome == "failed" and not str(result.get("failure_reason") or "").strip():
            violations.append(Violation(OUTCOME_HONESTY, f"a worker reported turn {turn_id} failed without saying why",
                                        where))
        turn = states.get(turn_id)
        if outcome == "completed" and (turn is None or turn["state"] != "done") \
                and not any(cut > index for cut in lossy_cuts):
            state = "absent" if turn is None else turn["state"]
            violations.append(Violation(OUTCOME_HONESTY, f"a worker reported turn {turn_id} completed; durably it "
                                                         f"is {state}", {**where, "turn": turn and turn_brief(turn)}))
        said, key = result.get("api_calls"), (event.get("incarnation"), turn_id)
        made = requests[key]
        if counted_calls and type(said) is int and said != made and key in announced:
            violations.append(Violation(OUTCOME_HONESTY, f"worker {event.get('incarnation')} reported {said} model "
                                                         f"call(s) for turn {turn_id}; it made {made}",
                                        {**where, "model_requests_made": made}))
    if counted_calls:
        violations += _uncounted_requests(states, Counter(turn for (_inc, turn), name in probes
                                                          if name == MODEL_REQUEST))
    violations += _unreported_ends(events)
    violations += trajectory_violations(d, logged, lossy=bool(lossy_cuts))
    if trajectories is not None:
        violations += unlogged_completions(events, logged)
    return verdict_of(OUTCOME_HONESTY, violations, {"outcomes": reported, "trajectories": len(logged)})


def _uncounted_requests(turns: dict[str, dict[str, Any]], made: Counter[Any]) -> list[Violation]:
    """Each model request of a turn, by whichever worker, was durably counted on the turn first
    (`model_calls`, a barrier commit): the count a turn's model-call limit holds across restarts by,
    and the one the daemon reports. A kill between a count and its request leaves the count higher,
    never lower."""
    return [Violation(OUTCOME_HONESTY, f"turn {turn_id} made {n} model request(s); durably it counted "
                                       f"{turns[turn_id].get('model_calls')}",
                      {"turn": turn_brief(turns[turn_id]), "model_requests_made": n})
            for turn_id, n in made.items()
            if turn_id in turns and int(turns[turn_id].get("model_calls") or 0) < n]


def _unreported_ends(events: list[dict[str, Any]]) -> list[Violation]:
    """A worker that ran (it said hello) and exited on its own reported how its turn ended first: one
    that exits without a word (an exception out of the runtime, a traceback) leaves its caller to
    guess, whatever its exit status says."""
    hello = {e.get("incarnation") for e in events if e.get("type") == "hello"}
    reported = {e.get("incarnation") for e in events if e.get("type") == "outcome"}
    return [Violation(OUTCOME_HONESTY, f"worker {e.get('incarnation')} exited with status {e.get('returncode')} "
                                       "without reporting how its turn ended", {"exit": e})
            for e in events if e.get("type") == "exit" and e.get("signal") is None
            and e.get("incarnation") in hello and e.get("incarnation") not in reported]


def fails_closed(events: Sequence[dict[str, Any]]) -> Verdict:
    """Every worker started on storage the nemesis had broken (a `storage_fault` event with
    phase "broken", see supervisor.chaos.nemesis.storage) failed closed: it exited 1 with
    `failure_reason` "session_persistence_failed:<cause>" for the fault's cause and a
    person-readable error, naming the turn it failed (the event's `turn`: one it was asked
    to run, or the interrupted turn it had read before the damage stopped it); it showed
    nothing and ran no tool; and the transcript it left is the one it found (the row
    snapshot before the break equals the one after mending). A worker that met a write lock held
    past its busy budget (`locked`) gave up within that budget the same way (`_gave_up_on_the_lock`);
    one that met it held for part of that budget (`busy`) waited it out (`_waited_out_the_lock`).
    """
    events = list(events)
    violations = []
    broken = [(i, e) for i, e in enumerate(events) if e.get("type") == "storage_fault" and e.get("phase") == "broken"]
    for index, fault in broken:
        inc = fault.get("incarnation")
        mine = [e for e in events if e.get("incarnation") == inc]
        where = {"storage_fault": fault}
        for e in mine:
            if e.get("type") in ("ui", "effect"):
                violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage still "
                                                          f"{'showed' if e['type'] == 'ui' else 'ran'} something",
                                            {**where, "event": e}))
        outcomes = [e.get("result") or {} for e in mine if e.get("type") == "outcome"]
        result = outcomes[-1] if outcomes else {}
        if result.get("failure_reason") != fault.get("expect") or not str(result.get("error") or "").strip():
            violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage did not fail as "
                                                      f"{fault.get('expect')} with an error for a person",
                                        {**where, "outcome": result or None}))
        if "turn" in fault and result and result.get("turn_id") != fault["turn"]:
            violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage did not name the "
                                                      f"turn it failed ({fault['turn']})",
                                        {**where, "outcome": result}))
        exits = [e for e in mine if e.get("type") == "exit"]
        if not exits or exits[-1].get("returncode") != EXIT_TURN_FAILED or exits[-1].get("signal") is not None:
            violations.append(Violation(FAILS_CLOSED, f"the worker on {fault.get('fault')} storage did not exit "
                                                      f"{EXIT_TURN_FAILED} on its own",
                                        {**where, "exit": exits[-1] if exits else None}))
        before = [e for e in events[:index] if e.get("type") == "snapshot"]
        after = [e for e in events[index:] if e.get("type") == "snapshot" and e.get("after") == "mend"]
        if not before or not after:
            violations.append(Violation(FAILS_CLOSED, "no row snapshot on both sides of the storage fault", where))
        elif (before[-1].get("rows") or {}) != (after[0].get("rows") or {}):
            old, new = before[-1].get("rows") or {}, after[0].get("rows") or {}
            changed = sorted((set(old) ^ set(new)) | {k for k in set(old) & set(new) if old[k] != new[k]})
            violations.append(Violation(FAILS_CLOSED, f"rows changed while storage was {fault.get('fault')}",
                                        {**where, "row_ids": changed[:20]}))
    locks = [e for e in events if e.get("type") == "storage_fault" and e.get("fault") in ("locked", "busy")
             and e.get("incarnation") is not None and e.get("expect")]
    for fault in locks:
        mine = [e for e in events if e.get("incarnation") == fault["incarnation"]]
        held_past_budget = fault["fault"] == "locked"
        violations += _gave_up_on_the_lock(fault, mine) if held_past_budget else _waited_out_the_lock(fault, mine)
    return verdict_of(FAILS_CLOSED, violations, {"storage_faults": len(broken) + len(locks)})


def _waited_out_the_lock(fault: dict[str, Any], mine: list[dict[str, Any]]) -> list[Violation]:
    """The worker that met a write lock held for part of its busy budget (`busy`) waited it out:
    it did not fail its turn as `locked`. Storage that is busy for a moment is no failure."""
    gave_up = [e.get("result") for e in mine if e.get("type") == "outcome"
               and (e.get("result") or {}).get("failure_reason") == fault.get("gives_up_as")]
    if not gave_up:
        return []
    return [Violation(FAILS_CLOSED, f"the worker gave up on a write lock held {fault.get('seconds')} s of its "
                                    f"{fault.get('budget')} s busy budget", {"storage_fault": fault, "outcome": gave_up[-1]})]


def _gave_up_on_the_lock(fault: dict[str, Any], mine: list[dict[str, Any]]) -> list[Violation]:
    """The worker that met a write lock held past its busy budget (`locked`) ended its wait itself,
    within its busy budget: it failed closed as `locked` with an error for a person and exited 1
    on its own. A worker the nemesis killed first (its planned kill landed during the wait) is
    excused; one the harness killed for hanging is not."""
    kills = [e for e in mine if e.get("type") == "kill"]
    if kills and all(k.get("by") != "timeout" for k in kills):
        return []
    where = {"storage_fault": fault}
    outcomes = [e.get("result") or {} for e in mine if e.get("type") == "outcome"]
    result = outcomes[-1] if outcomes else {}
    exits = [e for e in mine if e.get("type") == "exit"]
    out = []
    if result.get("failure_reason") != fault["expect"] or not str(result.get("error") or "").strip():
        out.append(Violation(FAILS_CLOSED, f"the worker that met a write lock held past its budget did not give up "
                                           f"within its busy budget ({fault.get('budget')} s) as {fault['expect']}",
                             {**where, "outcome": result or None}))
    if not exits or exits[-1].get("returncode") != EXIT_TURN_FAILED or exits[-1].get("signal") is not None:
        out.append(Violation(FAILS_CLOSED, f"the worker that met a write lock did not exit {EXIT_TURN_FAILED} on its own",
                             {**where, "exit": exits[-1] if exits else None}))
    return out


def coverage(events: Sequence[dict[str, Any]], planned: Fault | None) -> Verdict:
    """Every fault planned for the case landed, each on the worker it was aimed at.

    Each fault of the plan's chain is judged by the history of the worker started for its own
    (turn, process) alone (supervisor.chaos.checker.kills): a probe kill landed when that worker
    reported the n-th hit of its probe with `kill` True as its last word and was reaped dead of
    the nemesis's SIGKILL; a timer kill when the supervisor's timer killed that worker; a pause
    when that worker was seen stopped while another took its session over (cause "nemesis" in
    supervisor.chaos.checker.deaths, so a worker that lived on past its planned probe, or hung
    until the timeout killed it, is no landed kill). A fault whose worker never started or never
    reached its point is unknown ("unfired"); one that fired or was aimed but stopped nothing is
    unknown ("no-kill"). A chain with any fault not landed is never a pass.
    """
    probes_hit = of_type(events, "probe")
    landed_kills, other_deaths = count_deaths(events)
    kills = planned_kills(events, planned)
    counts = {"probe_hits": len(probes_hit), "kills": landed_kills,
              **{f"other_deaths_{cause}": n for cause, n in other_deaths.items()},
              "kills_planned": len(kills), "kills_planned_landed": sum(k.landed for k in kills)}
    missed = [k for k in kills if not k.landed]
    unfired = [k for k in missed if k.reason == UNFIRED and k.fault.probe]
    if unfired:  # how far the first kill that never fired got: its worker's hits of its probe
        counts["planned_probe_hits"] = unfired[0].hits
    if missed:
        return Verdict(UNKNOWN, [], counts, COVERAGE, message="; ".join(k.message for k in missed),
                       reasons=tuple(dict.fromkeys(str(k.reason) for k in missed)))
    return Verdict(True, [], counts, COVERAGE)
