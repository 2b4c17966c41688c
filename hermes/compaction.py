"""Compaction between turns: summarize older turns, keep the latest one verbatim.

Nothing is deleted: ``SessionDB.archive_and_compact`` marks the old rows inactive,
inserts the summary, and clones the kept tail as fresh active rows. A kill inside
that transaction leaves the session exactly as it was.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.transcript import sanitize_api_messages

if TYPE_CHECKING:
    from hermes.runner import AIAgent

SUMMARY_PROMPT = ("Summarize the conversation so far in a few sentences, keeping every fact a later "
                  "turn may need.")
SUMMARY_PREFIX = "[Summary of the earlier conversation]\n"


def compact_if_needed(agent: "AIAgent", max_active_rows: int) -> bool:
    """Compact the session when it holds more than `max_active_rows` active rows. True if it did.

    Call it between turns only: the rows of the newest turn are kept as clones, so
    its structure stays intact, and everything before it becomes one summary row.
    """
    db = agent.session_db
    if db is None or max_active_rows <= 0:
        return False
    messages = db.load_live_messages(agent.session_id)
    if len(messages) <= max_active_rows:
        return False
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=0)
    if last_user == 0:
        return False  # one turn only: nothing older to summarize
    older = messages[:last_user]
    response = agent.client.chat.completions.create(
        model=agent.model,
        messages=sanitize_api_messages(older) + [{"role": "user", "content": SUMMARY_PROMPT}])
    summary = (response.choices[0].message.content or "").strip() if response.choices else ""
    if not summary:
        return False  # no summary, no compaction: dropping history without one would lose facts
    db.archive_and_compact(agent.session_id, [{"role": "user", "content": SUMMARY_PREFIX + summary}],
                           watermark=older[-1]["_row_id"])
    return True
