"""Effects: tools ran as often as the contract allows, and every durable result tells the truth.

effect-semantics (counted against the effects ledger: its executions and its applied keyed
writes) and result-fidelity (each result against what its tool returns when run cleanly, and
each answer against the script).
"""
from __future__ import annotations

import json
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

from hermes.executor import parse_spilled
from hermes.outcomes import CANCELLED, CANCELLED_RESULT, UNKNOWN_OUTCOME
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT
from supervisor.chaos.checker.evidence import (
    DB,
    QUOTE,
    as_durable,
    brief,
    final_answers,
    load_applied,
    load_executions,
    of_type,
    turn_brief,
    unreadable,
)
from supervisor.chaos.checker.own_results import OwnRecords
from supervisor.chaos.checker.verdict import (
    CONTRACT,
    DAMAGE,
    EFFECT_SEMANTICS,
    NO_LEDGER,
    RESULT_FIDELITY,
    Verdict,
    Violation,
    unknown_verdict,
    verdict_of,
)
from supervisor.chaos.durable import Durable
from supervisor.chaos.scenarios import Expectation
from targetkit import EFFECT_MISMATCH, FULL_PROMISES, RAN_UNDISPATCHED, RERUN, RESULT_PREVIEW, Promises
from worker.chaos_tools import clean_results

# The tools of worker/chaos_tools.py: each records every real execution in the ledger,
# so for them "a result that claims success" implies "an execution row exists". Other
# tools (read_file, ...) never touch the ledger and cannot be judged that way.
# tests/test_checker.py keeps this in step with the chaos tool set.
CHAOS_TOOLS = frozenset({"lookup", "slow_lookup", "set_value", "append_note", "broken_tool", "restart_agent"})
# The chaos tools whose effect is a keyed write the ledger applies once per idempotency key
# (table kv, `Ledger.apply_once`): for them "the write happened" can be counted, not only "the
# tool ran".
KEYED_WRITES = frozenset({"set_value"})


def _call_key(session: Any, turn: Any, call_id: Any) -> tuple[str, str, str]:
    # Intents store a missing turn as "", rows and the ledger as NULL: one spelling for both.
    return (session or "", turn or "", call_id or "")


def _result_kind(content: Any) -> str:
    """What a tool row claims: "unknown" (outcome unknown), "error", "cancelled" or "success"."""
    parsed = content
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
    if isinstance(parsed, dict):
        if parsed.get("status") == "outcome_unknown":
            return "unknown"
        if "error" in parsed:
            return "error"
    if isinstance(content, str):
        # A spilled result keeps only a preview, which no longer parses as JSON.
        if '"status": "outcome_unknown"' in content or '"status":"outcome_unknown"' in content:
            return "unknown"
        if content.startswith(CANCELLED_RESULT):
            return "cancelled"
    return "success"


CallKey = tuple[str, str, str]


def _by_call(executions: list[dict[str, Any]], d: Durable) -> tuple[
        dict[CallKey, list[dict[str, Any]]], dict[CallKey, list[dict[str, Any]]], dict[CallKey, list[dict[str, Any]]]]:
    """Per tool call: its executions (ledger), its dispatch intents and its original result rows."""
    runs: dict[CallKey, list[dict[str, Any]]] = defaultdict(list)
    for e in executions:
        if e.get("session_id") is not None:  # a tool run outside any session answers no call
            runs[_call_key(e["session_id"], e["turn_id"], e["tool_call_id"])].append(e)
    intents: dict[CallKey, list[dict[str, Any]]] = defaultdict(list)
    for i in d.dispatches:
        intents[_call_key(i["session_id"], i["turn_id"], i["tool_call_id"])].append(i)
    # Originals only: a compaction clone repeats a result, it does not record a second one.
    results: dict[CallKey, list[dict[str, Any]]] = defaultdict(list)
    for row in d.rows:
        if row["role"] == "tool" and row["cloned_from"] is None:
            results[_call_key(row["session_id"], row["turn_id"], row["tool_call_id"])].append(row)
    return runs, intents, results


def effect_semantics(db: DB, ledger: Path | Sequence[dict[str, Any]] | None,
                     events: Sequence[dict[str, Any]] = (), *,
                     ledgered_tools: Collection[str] = CHAOS_TOOLS,
                     keyed_writes: Collection[str] = KEYED_WRITES,
                     applied: Path | Sequence[dict[str, Any]] | None = None,
                     promises: Promises = FULL_PROMISES, read_only: Collection[str] = ()) -> Verdict:
    """Tool effects, as counted by the effects ledger, match what the transcript claims.

    Per tool call (session, turn, tool_call_id):
    * an `at_most_once` call executed at most once;
    * an `idempotent` call executed more than once only under one single idempotency key, unless
      its tool is one of `read_only` (a user's tool declared idempotent and parallel-safe: it has
      no effect, so it may rerun freely);
    * no call executed more often than it was durably dispatched (one intent per dispatch);
    * the two rules above hold per logical call too: runs of one tool with equal arguments in one
      turn, under several call ids, are one call rerun under a new id (as a framework that asks
      the model again after a crash does) unless the transcript asks for that call as often;
    * a result claiming success for a ledger-recording tool has an execution behind it
      (so an at_most_once success has exactly one); an error result may have none (the
      arguments were refused before anything ran);
    * a result saying the outcome is unknown has a dispatch intent behind it;
    * a result saying the call was cancelled has no execution behind it;
    * in a turn that completed ('done'), every dispatched call has a recorded result:
      an unknown outcome is written down, never dropped.
    And per keyed write (the ledger's applied writes, table kv; tools `keyed_writes`):
    * every idempotency key was applied at most once: two applications under one key are one
      write done twice;
    * in a turn that completed ('done'), every dispatched idempotent call of a keyed-write tool
      was applied exactly once: never applied, the write was lost (recovery gave it up as
      "outcome unknown" instead of rerunning it under its key, say), unless its turn's interrupt
      cut it off and its result says its outcome is unknown (the user's interrupt gave it up, not
      recovery); applied under several keys, it was done more than once.

    The applied writes are read from `applied`, or from `ledger` when that is a path (given
    the executions alone and no `applied`, they are not judged). Without a readable ledger
    nothing can be counted, and the answer is unknown; so it is when a keyed write was
    dispatched or executed and the ledger cannot tell which writes were applied (a ledger
    older than its kv table), unless a rule above is already broken. For a target that
    records no dispatch intents, "ran more often than dispatched" is a CONTRACT violation (it
    promised none); everything else here is DAMAGE.
    """
    d = as_durable(db)
    if d.error:
        return unreadable(EFFECT_SEMANTICS, d)
    executions = load_executions(ledger)
    if isinstance(executions, str):
        return unknown_verdict(EFFECT_SEMANTICS, executions, NO_LEDGER)
    # A tool seen reporting an effect or recording one writes to the ledger, whatever its name.
    ledgered = set(ledgered_tools) | {e["tool"] for e in executions}
    ledgered |= {e.get("tool") for e in of_type(events, "effect") if e.get("tool")}

    runs, intents, results = _by_call(executions, d)
    violations: list[Violation] = []

    def flag(message: str, key: tuple[str, str, str], kind: str = DAMAGE, rule: str = EFFECT_MISMATCH,
             **witness: Any) -> None:
        # `rule`: which rule broke, for the target's record of what it promises (checker.promises).
        violations.append(Violation(EFFECT_SEMANTICS, message, {
            "rule": rule, "session": key[0], "turn": key[1], "tool_call_id": key[2],
            "executions": runs.get(key, []), "intents": intents.get(key, []), **witness}, kind))

    for key, done in runs.items():
        policies = {e["policy"] for e in done} | {i["policy"] for i in intents.get(key, [])}
        tool = done[0]["tool"]
        if AT_MOST_ONCE in policies and len(done) > 1:
            flag(f"at_most_once tool {tool} executed {len(done)} times for call {key[2]}", key, rule=RERUN)
        keys = {e["idempotency_key"] for e in done}
        if IDEMPOTENT in policies and len(done) > 1 and len(keys) > 1 and tool not in read_only:
            flag(f"idempotent tool {tool} reran for call {key[2]} under {len(keys)} different idempotency keys",
                 key, rule=RERUN, idempotency_keys=sorted(map(str, keys)))
        if len(done) > len(intents.get(key, [])):
            flag(f"tool {tool} executed {len(done)} time(s) for call {key[2]} but was durably dispatched "
                 f"{len(intents.get(key, []))} time(s)", key, DAMAGE if promises.dispatch_intents else CONTRACT,
                 rule=RAN_UNDISPATCHED)
    _reruns_under_new_ids(runs, _requested_calls(d), results, read_only, flag)

    kinds: Counter[str] = Counter()
    for key, rows in results.items():
        for row in rows:
            kind = _result_kind(row["content"])
            kinds[kind] += 1
            tool = row.get("name") or next((i["tool_name"] for i in intents.get(key, [])), None)
            if kind == "unknown" and not intents.get(key):
                flag(f"result of call {key[2]} says its outcome is unknown, but it was never dispatched", key,
                     row=brief(row))
            elif kind == "success" and tool in ledgered and not runs.get(key):
                flag(f"result of {tool} call {key[2]} claims success, but the tool never executed", key,
                     row=brief(row))
            elif kind == "cancelled" and runs.get(key):
                flag(f"result of {tool} call {key[2]} says it was cancelled, but the tool executed", key,
                     row=brief(row))

    done_turns = {t["id"] for t in d.turns if t["state"] == "done"}
    for key in intents:
        if key[1] in done_turns and key not in results:
            flag(f"call {key[2]} was dispatched in completed turn {key[1]} and its outcome was never recorded",
                 key)

    if applied is None and isinstance(ledger, (str, Path)):
        applied = ledger
    writes = load_applied(applied) if applied is not None else None
    not_judged = _keyed_writes(writes, keyed_writes, runs, intents, results, done_turns, _cut_off_turns(d, events),
                               flag, violations)
    counts = {"executions": len(executions), "calls_executed": len(runs), "intents": len(d.dispatches),
              "results": sum(kinds.values()), **{f"results_{k}": n for k, n in sorted(kinds.items())},
              "applied_writes": len(writes) if isinstance(writes, list) else 0}
    return verdict_of(EFFECT_SEMANTICS, violations, counts, unknown=not_judged, reason=NO_LEDGER)


def _canonical_arguments(arguments: Any) -> str:
    """One spelling of a call's arguments, however it was written (text or decoded)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _reruns_under_new_ids(runs: dict[CallKey, list[dict[str, Any]]],
                          requested: dict[CallKey, tuple[str, Any]],
                          results: dict[CallKey, list[dict[str, Any]]], read_only: Collection[str],
                          flag: Callable[..., None]) -> None:
    """At-most-once and idempotency per logical call: (session, turn, tool, arguments).

    A framework that loses a call in a crash and asks the model again reruns it under the id
    of the new reply; counted per call id, that rerun looks like a first run. Runs whose ledger
    row has no arguments (a ledger older than that column) are judged per call id alone. The
    transcript may really ask for one call several times in a turn: as many call ids as it asks
    for are separate calls, only the ids beyond them are reruns; and so is one run by a later
    process after a run whose result was never stored (the call lost, and asked for again)."""
    groups: dict[tuple[str, str, str, str], list[CallKey]] = defaultdict(list)
    for key, done in runs.items():
        if done[0].get("arguments") is None:
            continue
        groups[(key[0], key[1], done[0]["tool"], _canonical_arguments(done[0]["arguments"]))].append(key)
    for (session, turn, tool, arguments), keys in groups.items():
        if len(keys) < 2:
            continue
        asked = sum(1 for k, (name, args) in requested.items()
                    if k[:2] == (session, turn) and name == tool and _canonical_arguments(args) == arguments)
        allowed = max(1, asked)
        unanswered = [min(e["incarnation"] for e in runs[k]) for k in keys if not results.get(k)]
        lost_then_rerun = any(e["incarnation"] > first for first in unanswered for k in keys for e in runs[k])
        if len(keys) <= allowed and not lost_then_rerun:
            continue
        allowed = min(allowed, len(keys) - 1)
        done = [e for k in keys for e in runs[k]]
        policies = {e["policy"] for e in done}
        ids = sorted(k[2] for k in keys)
        witness = {"executions": done, "call_ids": ids, "arguments": arguments, "asked": asked}
        if AT_MOST_ONCE in policies:
            flag(f"at_most_once tool {tool} executed {len(done)} times for one call ({arguments}) of turn {turn}, "
                 f"rerun under {len(ids)} call ids where the transcript asks for it {asked} time(s)",
                 keys[0], rule=RERUN, **witness)
        ikeys = {e["idempotency_key"] for e in done if e["idempotency_key"] is not None}
        if IDEMPOTENT in policies and len(ikeys) > allowed and tool not in read_only:
            flag(f"idempotent tool {tool} reran one call ({arguments}) of turn {turn} under {len(ikeys)} "
                 f"different idempotency keys, with {len(ids)} call ids", keys[0], rule=RERUN,
                 idempotency_keys=sorted(map(str, ikeys)), **witness)


def _keyed_writes(writes: list[dict[str, Any]] | str | None, keyed_writes: Collection[str],
                  runs: dict[CallKey, list[dict[str, Any]]], intents: dict[CallKey, list[dict[str, Any]]],
                  results: dict[CallKey, list[dict[str, Any]]], done_turns: set[str],
                  cut_off: set[tuple[str, str]], flag: Callable[..., None], violations: list[Violation]) -> str | None:
    """The keyed-write rules of effect_semantics, on the ledger's applied writes; a string when
    they had to be judged and could not be (the applied writes cannot be read)."""
    # Per call of a keyed-write tool: the idempotency keys it was dispatched or ran under. The
    # tool applies under the call id when it was given no key (worker.chaos_tools.set_value).
    calls: dict[CallKey, set[str]] = defaultdict(set)
    for key, its in intents.items():
        for i in its:
            if i["tool_name"] in keyed_writes:
                calls[key].add(i["idempotency_key"])
    for key, done in runs.items():
        for e in done:
            if e["tool"] in keyed_writes:
                calls[key].add(e["idempotency_key"] or key[2])
    if writes is None:
        return None  # not asked: the caller gave the executions alone
    if isinstance(writes, str):
        return f"{writes}: the keyed writes of {len(calls)} call(s) cannot be counted" if calls else None
    applications: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for w in writes:
        applications[w["idempotency_key"]].append(w)
    for ikey, rows in applications.items():
        if len(rows) > 1:
            violations.append(Violation(EFFECT_SEMANTICS, f"idempotency key {ikey} was applied {len(rows)} times: "
                                                          "one write was done more than once", {
                "rule": RERUN, "idempotency_key": ikey, "applications": rows,
                "calls": [list(key) for key, keys in calls.items() if ikey in keys]}))
    for key, keys in calls.items():
        its = intents.get(key, [])
        if key[1] not in done_turns or not its or {i["policy"] for i in its} != {IDEMPOTENT}:
            continue
        if key[:2] in cut_off and any(_result_kind(r["content"]) == "unknown" for r in results.get(key, [])):
            continue  # the turn's interrupt gave it up, saying so (result-fidelity judges that answer)
        tool = its[0]["tool_name"]
        applied_keys = sorted(k for k in keys if applications.get(k))
        witness = {"idempotency_keys": sorted(keys), "applications": [w for k in applied_keys for w in applications[k]],
                   "results": [brief(r) for r in results.get(key, [])]}
        if not applied_keys:
            flag(f"idempotent write {tool} of call {key[2]} in completed turn {key[1]} was never applied: "
                 "the write was lost", key, **witness)
        elif len(applied_keys) > 1:
            flag(f"idempotent write {tool} of call {key[2]} in completed turn {key[1]} was applied under "
                 f"{len(applied_keys)} idempotency keys: it was done more than once", key, rule=RERUN, **witness)
    return None


def _interrupted(events: Sequence[dict[str, Any]]) -> bool:
    """Did some worker of the case stop before it could tell how its turn ended (killed,
    paused and overtaken, or failed on its storage)? Only then may a result be unknown."""
    return any((e.get("type") == "exit" and (e.get("signal") is not None or e.get("returncode") not in (0, None)))
               or e.get("type") == "pause" for e in events)


def _cut_off_turns(d: Durable, events: Sequence[dict[str, Any]]) -> set[tuple[str, str]]:
    """(session, turn) of every turn an interrupt cut off: ended 'failed' with the error
    "cancelled" (a cancel request, hermes.outcomes.CANCELLED), or run by a worker that stopped on
    SIGINT (a KeyboardInterrupt reached the turn, and hermes.executor answered its cut-off calls)."""
    cancelled = {t["id"] for t in d.turns if t["state"] == "failed" and t.get("error") == CANCELLED}
    stopped = {e.get("incarnation") for e in of_type(events, "exit") if e.get("signal") == signal.SIGINT}
    cancelled |= {e.get("turn_id") for e in of_type(events, "spawn") if e.get("incarnation") in stopped}
    return {(t["session_id"] or "", t["id"]) for t in d.turns if t["id"] in cancelled}


def ended_turns(d: Durable, events: Sequence[dict[str, Any]]) -> set[tuple[str, str]]:
    """(session, turn) of every turn the daemon ended (a `turn_ended` event: cancelled or given up,
    supervisor.chaos.nemesis.ending), its unanswered calls answered in the same transaction."""
    ended = {e.get("turn_id") for e in of_type(events, "turn_ended") if e.get("ended")}
    return {(t["session_id"] or "", t["id"]) for t in d.turns if t["id"] in ended}


def _says_not_run(content: Any) -> bool:
    """Does a result say its call was never run (hermes.outcomes: a JSON object whose error begins "Not run")?"""
    try:
        parsed = json.loads(content) if isinstance(content, str) else content
    except ValueError:
        return False
    return isinstance(parsed, dict) and str(parsed.get("error", "")).startswith("Not run")


def _unknown_refused(intents: list[dict[str, Any]], interrupted: bool, cut_off: bool) -> str | None:
    """Why the unknown-outcome result is not allowed for a call with these dispatch intents
    (the rules in result_fidelity's docstring); None when it is."""
    if not intents:
        return "it was never dispatched"
    if cut_off:
        return None
    if not interrupted:
        return "no worker of the case was interrupted"
    if {i["policy"] for i in intents} == {IDEMPOTENT}:
        return (f"{intents[0]['tool_name']} is idempotent: recovery must rerun it under its idempotency key "
                f"{intents[-1]['idempotency_key']!r} (attempt {len(intents) + 1}), not give it up as unknown")
    return None


def _requested_calls(d: Durable) -> dict[tuple[str, str, str], tuple[str, Any]]:
    """(session, turn, call id) -> (tool name, decoded arguments or the raw text) of every
    call an original assistant row asked for."""
    calls: dict[tuple[str, str, str], tuple[str, Any]] = {}
    for row in d.rows:
        if row["role"] != "assistant" or row["cloned_from"] is not None:
            continue
        for call in row.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            raw = function.get("arguments")
            try:
                arguments = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
            except ValueError:
                arguments = raw
            calls[_call_key(row["session_id"], row["turn_id"], call.get("id"))] = (function.get("name"), arguments)
    return calls


def _spilled_text(spilled: tuple[str, int, Path], db_path: Path) -> tuple[str, str | None]:
    """The whole text of a result spilled to a file (hermes.executor.parse_spilled), read back from
    the file, or why it cannot stand for the result: the file must lie in the database's directory
    tree, exist, hold exactly as many characters as the note says, and begin with the preview."""
    preview, chars, path = spilled
    home = Path(db_path).resolve().parent
    if not path.resolve().is_relative_to(home):
        return "", f"lies outside the directory of its database ({home})"
    try:
        text = path.read_text(encoding="utf-8", errors="surrogatepass")
    except FileNotFoundError:
        return "", "is missing"
    except OSError as exc:
        return "", f"cannot be read ({exc.strerror or exc})"
    if len(text) != chars:
        return text, f"holds {len(text)} characters, not the {chars} its preview row names"
    if not text.startswith(preview):
        return text, "does not begin with the preview its row shows"
    return text, None


PREVIEW_PREFIX = 200  # characters of a long result that its preview must hold, in order


def _is_preview(content: Any, expected: Collection[Any]) -> bool:
    """Whether `content` is a shortened preview of one of the `expected` results: shorter than
    it, and holding its first PREVIEW_PREFIX characters (a runtime that keeps only the beginning
    of an oversized result, with a note of its own around it)."""
    return isinstance(content, str) and any(
        isinstance(e, str) and len(e) > max(len(content), PREVIEW_PREFIX) and e[:PREVIEW_PREFIX] in content
        for e in expected)


def result_fidelity(db: DB, events: Sequence[dict[str, Any]] = (), expect: Expectation | None = None, *,
                    oracle: Callable[[str, Any], frozenset[str] | None] = clean_results,
                    own: OwnRecords | str | None = None, promises: Promises = FULL_PROMISES) -> Verdict:
    """Every durable result says what really happened, and every completed answer is the script's.

    Each original tool row equals, character for character, a result its tool returns for
    the call's arguments when run cleanly (`oracle`, the chaos tools' own result builders),
    unless it is a result the contract allows for that call:
    * the unknown-outcome result, when the call's dispatch intent is durable, its policy is
      `at_most_once`, and some worker of the case was interrupted (killed, overtaken, or
      failed on storage). An `idempotent` call left with an intent and no result is rerun by
      recovery under the same idempotency key, so it must end with a clean result: the
      unknown outcome is allowed for it only when its turn's interrupt cut it off, that is
      when the turn ended 'failed' with the error "cancelled" (a cancel request) or a worker
      running that turn stopped on SIGINT (KeyboardInterrupt: hermes.executor answers the
      calls such an interrupt cuts off with the unknown outcome);
    * the cancelled result, when no dispatch intent was ever recorded (the call never started).
    A result too big for the transcript is judged by the file its preview row names (it must be
    in the database's directory tree, hold the whole text, and begin with the preview); a target
    that promises where that begins (`promises.spills_results_over`) spills every result longer
    than that, and no other.
    A harness or runtime error disguised as a tool result (a lost ledger write, a tool that
    crashed on the harness's own bug) fails here with the row and the clean results as witness.
    A user's own tool, run through the ledger (`own`: supervisor.chaos.checker.own_results), has
    no such oracle: its result must be, character for character, what one of that call's runs
    returned as the ledger recorded it (none recorded: no clean result is possible).
    Results of other tools the oracle does not know are counted, not judged. When
    `expect.final_answers` names a text for a turn's position (turns ordered by creation), the
    completed turn's answer is exactly that text.
    """
    d = as_durable(db)
    if d.error:
        return unreadable(RESULT_FIDELITY, d)
    requested = _requested_calls(d)
    intents: dict[CallKey, list[dict[str, Any]]] = defaultdict(list)
    for i in d.dispatches:
        intents[_call_key(i["session_id"], i["turn_id"], i["tool_call_id"])].append(i)
    interrupted = _interrupted(events)
    cut_off = _cut_off_turns(d, events)
    ended = ended_turns(d, events)
    violations: list[Violation] = []
    judged = unjudged = allowed = 0
    for row in d.rows:
        if row["role"] != "tool" or row["cloned_from"] is not None:
            continue
        key = _call_key(row["session_id"], row["turn_id"], row["tool_call_id"])
        content = row["content"]
        name, arguments = requested.get(key, (row.get("name"), None))
        judgeable = name is not None and key in requested and isinstance(arguments, dict)
        expected = oracle(name, arguments) if judgeable else None
        recorded = expected is None and judgeable and isinstance(own, OwnRecords) and name in own.declared
        if recorded:
            assert isinstance(own, OwnRecords)
            expected = frozenset(own.returned.get(key, ()))
        witness = {"row_id": row["id"], "row": brief(row), "tool": name, "arguments": arguments}
        if content == UNKNOWN_OUTCOME:
            why = _unknown_refused(intents.get(key, []), interrupted, key[:2] in cut_off)
            if why is None:
                allowed += 1
            else:
                violations.append(Violation(RESULT_FIDELITY, f"call {key[2]} is recorded with an unknown outcome, "
                                                             f"but {why}", dict(
                    witness, intents=intents.get(key, []),
                    **({"clean_results": sorted(expected)} if expected is not None else {}))))
            continue
        if isinstance(content, str) and content.startswith(CANCELLED_RESULT):
            if key in intents:
                violations.append(Violation(RESULT_FIDELITY, f"call {key[2]} is recorded as cancelled, but its "
                                                             "dispatch intent is durable: it may have run", witness))
            else:
                allowed += 1
            continue
        said = _result_kind(content)
        if key[:2] in ended and (said == "unknown" or (said == "error" and _says_not_run(content))):
            # Answered when the daemon ended the turn: the words must be the truth about its intents.
            if (said == "unknown") == (key in intents):
                allowed += 1
            else:
                violations.append(Violation(RESULT_FIDELITY, f"call {key[2]} of turn {key[1]}, which the daemon "
                                            "ended, is answered " + (
                                                "as not run, but its dispatch intent is durable: it may have run"
                                                if key in intents else "with an unknown outcome, but it was never "
                                                "dispatched"), dict(witness, intents=intents.get(key, []))))
            continue
        if expected is None:
            unjudged += 1
            continue
        judged += 1
        spilled = parse_spilled(content)
        if spilled is not None:
            content, problem = _spilled_text(spilled, d.path)
            if problem is not None:
                violations.append(Violation(RESULT_FIDELITY, f"the result of {name} call {key[2]} was spilled to a "
                                                             f"file that {problem}", dict(witness, file=str(spilled[2]))))
                continue
        limit = promises.spills_results_over
        if limit is not None and isinstance(content, str) and (len(content) > limit) != (spilled is not None):
            violations.append(Violation(RESULT_FIDELITY, f"the result of {name} call {key[2]} ({len(content)} "
                                        "characters) was " + ("spilled to a file although within" if spilled is not None
                                                              else "kept in the transcript although over")
                                        + f" the {limit} characters its runtime keeps inline",
                                        dict(witness, characters=len(content), spill_limit=limit)))
        if content not in expected:
            said = ("what any run of it returned, as the effects ledger recorded" if recorded
                    else f"what {name} returns for these arguments")
            preview = _is_preview(content, expected)
            violations.append(Violation(RESULT_FIDELITY, f"the result of {name} call {key[2]} is not {said}"
                                        + (" (a shortened preview of it)" if preview else ""), dict(
                witness, content=content if not isinstance(content, str) else content[:QUOTE],
                clean_results=sorted(expected), **({"rule": RESULT_PREVIEW} if preview else {}))))
    expected_answers = expect.final_answers if expect is not None else ()
    answers = final_answers(d)
    for index, turn in enumerate(d.turns):
        given = answers.get(turn["id"], [])
        if (turn["state"] == "done" and index < len(expected_answers) and expected_answers[index]
                and len(given) == 1 and given[0]["content"] != expected_answers[index]):
            violations.append(Violation(RESULT_FIDELITY, f"turn {turn['id']} answered something else than the "
                                                         "script", {"turn": turn_brief(turn),
                                                                    "expected": expected_answers[index],
                                                                    "row_id": given[0]["id"],
                                                                    "row": brief(given[0])}))
    return verdict_of(RESULT_FIDELITY, violations, {"results_judged": judged, "results_allowed": allowed,
                                                    "results_unjudged": unjudged})
