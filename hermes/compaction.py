"""Compaction: summarize older turns, keep the current (or latest) turn verbatim.

It happens at two moments, the same way at both:

- between turns (`compact_if_needed`; the worker's ``--compact-above ROWS`` before a new turn);
- inside a turn (`compact_in_turn`; the agent's ``compact_above``), once a tool block's results
  are all durable and before the next model call, so a long tool loop does not grow every
  request of the turn until it ends. The rows of the turn so far are kept as clones.

Nothing is deleted: ``SessionDB.archive_and_compact`` marks the old rows inactive, inserts the
summary, and clones the kept tail as fresh active rows (each clone keeps its turn id, tool calls
and tool_call_id, and records ``cloned_from``), in one transaction with the ``compact.in_txn``
probe inside it. A kill inside that transaction leaves the session exactly as it was.

A summary request that fails, or comes back blank, means no compaction: dropping history
without a summary would lose facts, and an unavailable summarizer must not cost a turn.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from hermes.transcript import call_ids, sanitize_api_messages, trailing_tool_block

if TYPE_CHECKING:
    from hermes.runner import AIAgent

log = logging.getLogger("hermes.compaction")

SUMMARY_PROMPT = ("Summarize the conversation so far in a few sentences, keeping every fact a later "
                  "turn may need.")
SUMMARY_PREFIX = "[Summary of the earlier conversation]\n"


def _summary(agent: "AIAgent", older: list[dict[str, Any]]) -> str:
    """The model's summary of `older` ("" when it gave none); raises what the request raised."""
    # Imported here: the supervisor and the daemon import this module for its prompt and prefix, and
    # must not pay for the OpenAI SDK (about 1 s of CPU per process) that only a worker calls.
    from hermes import chat_request

    response = chat_request.create(agent.client, {
        "model": agent.model,
        "messages": sanitize_api_messages(older) + [{"role": "user", "content": SUMMARY_PROMPT}]})
    choices = getattr(response, "choices", None)
    if not choices:
        return ""
    content = getattr(choices[0].message, "content", None)
    return content.strip() if isinstance(content, str) else ""


def _summary_row(summary: str) -> dict[str, Any]:
    return {"role": "user", "content": SUMMARY_PREFIX + summary}


def is_summary(message: dict[str, Any]) -> bool:
    """A live message compaction wrote: a user row of no turn whose text starts with SUMMARY_PREFIX."""
    content = message.get("content")
    return (message.get("role") == "user" and message.get("_turn_id") is None
            and isinstance(content, str) and content.startswith(SUMMARY_PREFIX))


def compact_if_needed(agent: "AIAgent", max_active_rows: int) -> bool:
    """Compact the session when it holds more than `max_active_rows` active rows and a turn older
    than its newest (an earlier summary is none: summarizing it again only rewords it). True if it did.

    Call it between turns only: the newest turn's rows are kept as clones, everything before them
    becomes one summary row. A failed summary request raises (the caller decides; the worker logs it).
    """
    db = agent.session_db
    if db is None or max_active_rows <= 0:
        return False
    messages = db.load_live_messages(agent.session_id)
    if len(messages) <= max_active_rows:
        return False
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=0)
    older = messages[:last_user]
    if all(is_summary(m) for m in older):
        return False  # one turn only, after earlier summaries at most: no older turn to summarize
    summary = _summary(agent, older)
    if not summary:
        return False  # no summary, no compaction: dropping history without one would lose facts
    db.archive_and_compact(agent.session_id, [_summary_row(summary)], watermark=older[-1]["_row_id"])
    return True


def _at_block_boundary(messages: list[dict[str, Any]]) -> bool:
    """Does the transcript end with a tool block whose every call has its result, all of it durable?
    The one point inside a turn where compaction may run: nothing is half done, and the model has
    not yet been asked about the results."""
    block, answered = trailing_tool_block(messages)
    if block is None or not set(call_ids(block)) <= answered:
        return False
    return bool(messages[-1].get("_db_persisted"))  # the newest durable: so is all before it (Turn.flush)


def compact_in_turn(agent: "AIAgent", messages: list[dict[str, Any]], max_active_rows: int) -> bool:
    """Compact the session inside the current turn when it has outgrown `max_active_rows`.

    Only at a tool block's end (`_at_block_boundary`), only when the session has more than
    `max_active_rows` active rows and rows of an older turn (an earlier summary alone is not one:
    summarizing it again would gain nothing and cost a model call per tool round). Older turns
    become one summary row and the current turn's rows are kept as clones, exactly as between
    turns; then `messages` is replaced, in place, by the reloaded live transcript, so every
    `_row_id` names an active clone and later flushes append after them.

    Returns False only when storage failed (a read, or the compaction's write): the failure is
    noted on the turn, which the caller ends closed (a lost lease must stop the turn). A failed or
    blank summary is no failure: the turn goes on uncompacted.
    """
    db = agent.session_db
    turn = agent.turn
    if db is None or max_active_rows <= 0 or turn.id is None or not _at_block_boundary(messages):
        return True
    session = agent.session_id
    try:
        if db.count_active_messages(session) <= max_active_rows:
            return True
        live = db.load_live_messages(session)
    except Exception as exc:
        turn.note_failure(exc)
        return False
    start = next((i for i, m in enumerate(live) if m["role"] == "user" and m.get("_turn_id") == turn.id), None)
    if start is None:
        return True  # the turn's question is not in the live transcript: nothing to anchor the kept tail
    older = live[:start]
    if all(is_summary(m) for m in older):
        return True  # no older turn (only an earlier summary, or nothing)
    try:
        summary = _summary(agent, older)
    except Exception as exc:  # the model endpoint's failure; KeyboardInterrupt still interrupts the turn
        log.warning("turn %s: compaction skipped, the summary request failed: %s: %s", turn.id,
                    type(exc).__name__, exc)
        return True
    if not summary:
        log.warning("turn %s: compaction skipped, the summary came back blank", turn.id)
        return True
    try:
        db.archive_and_compact(session, [_summary_row(summary)], watermark=older[-1]["_row_id"])
        reloaded = db.load_live_messages(session)
    except Exception as exc:
        turn.note_failure(exc)
        return False
    messages[:] = reloaded
    log.info("turn %s: compacted session %s inside the turn: %d older rows summarized", turn.id, session,
             len(older))
    return True
