"""Streams: streamed text a client was shown ends committed as shown, or retracted (stream-honesty)."""
from __future__ import annotations

from typing import Any, Sequence

from supervisor.chaos.checker.evidence import QUOTE, when
from supervisor.chaos.checker.verdict import CONTRACT, DAMAGE, STREAM_HONESTY, Verdict, Violation, verdict_of
from targetkit import FULL_PROMISES, Promises


def stream_honesty(events: Sequence[dict[str, Any]], promises: Promises = FULL_PROMISES) -> Verdict:
    """Streamed text a client was shown ends honestly, whatever was killed.

    The rule: streamed deltas are provisional. The deltas one worker shows for one turn
    since its previous `stream_end` form one streamed reply, and it must end in exactly one of
    * a `stream_end` "commit" from that worker whose text equals the deltas joined (the
      reply's durable content; durable-before-visible checks that it was durable), or
    * a `stream_end` "retract" from that worker, or, when that worker died first, from a
      later worker of the same turn (a resumed worker retracts its turn's open streams
      before anything else), after which a client drops the provisional text; or the
      daemon ending the turn once that worker died (a `turn_ended` event: the turn is over,
      failed, for every client).
    A reply left open at the end of the case, or committed with other text than was
    streamed, is a violation (CONTRACT for a target that does not promise retraction).
    """
    kind = DAMAGE if promises.stream_retraction else CONTRACT
    open_replies: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    exited: set[Any] = set()
    violations: list[Violation] = []
    replies = commits = retracts = 0
    for e in events:
        if e.get("type") == "exit":
            exited.add(e.get("incarnation"))
            continue
        if e.get("type") == "turn_ended" and e.get("ended"):
            # The daemon ended the turn (supervisor.chaos.nemesis.ending) with its workers dead: the
            # turn is over 'failed' for every client, and what it streamed provisionally goes with it.
            for other in [w for w in open_replies if w[1] == e.get("turn_id") and w[0] in exited]:
                open_replies.pop(other)
                replies += 1
                retracts += 1
            continue
        if e.get("type") != "ui":
            continue
        where = (e.get("incarnation"), e.get("turn"))
        if e.get("kind") == "stream":
            open_replies.setdefault(where, []).append(e)
        elif e.get("kind") == "stream_end" and e.get("outcome") == "commit":
            deltas = open_replies.pop(where, [])
            if not deltas:
                continue  # nothing was shown provisionally, so nothing to reconcile
            replies += 1
            commits += 1
            streamed = "".join(str(x.get("text") or "") for x in deltas)
            if e.get("text") != streamed:
                violations.append(Violation(STREAM_HONESTY, f"turn {e.get('turn')}: the committed reply differs "
                                                            "from the text that was streamed", {
                    "streamed": streamed[:QUOTE], "committed": str(e.get("text"))[:QUOTE],
                    "event": when(e)}, kind))
        elif e.get("kind") == "stream_end" and e.get("outcome") == "retract":
            # Its own open reply, and every reply of this turn whose worker is already dead.
            for other in [w for w in open_replies
                          if w == where or (w[1] == e.get("turn") and w[0] in exited)]:
                open_replies.pop(other)
                replies += 1
                retracts += 1
    for (incarnation, turn), deltas in open_replies.items():
        replies += 1
        shown = "".join(str(x.get("text") or "") for x in deltas)
        violations.append(Violation(STREAM_HONESTY, f"turn {turn}: text streamed by worker {incarnation} was "
                                                    "never committed nor retracted", {
            "incarnation": incarnation, "turn": turn, "shown": shown[:QUOTE], "deltas": len(deltas),
            "first_shown": when(deltas[0])}, kind))
    return verdict_of(STREAM_HONESTY, violations, {"streamed_replies": replies, "committed": commits,
                                                   "retracted": retracts})
