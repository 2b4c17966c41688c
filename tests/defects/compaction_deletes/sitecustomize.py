"""Deliberate defect: compaction deletes the rows it summarizes instead of archiving them.

Loaded only by worker processes (see `worker_only.is_worker`). `SessionDB.archive_and_compact`
must mark the summarized rows inactive (and clone the kept tail as fresh rows), never
delete. Here it is replaced by the "obvious" version: read the tail, DELETE every active
row of the session, insert the summary and the tail's copies. The transcript a model sees
next looks the same, but rows the supervisor had already seen durable (the earlier turns'
questions, tool calls and answers) are gone from the database, so the checker must report
`no-lost-rows`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "compaction-deletes"
_COLUMNS = ("id", "turn_id", "role", "content", "content_kind", "tool_calls", "tool_call_id", "name", "extra")


def _arm() -> None:
    from hermes import probes
    from hermes.state import SessionDB

    def delete_and_compact(self, session_id, compacted_messages, watermark=None):
        def compact(conn):
            tail = []
            if watermark is not None:
                tail = [self._row_to_dict(dict(zip(_COLUMNS, row))) for row in conn.execute(
                    "SELECT id, turn_id, role, content, content_kind, tool_calls, tool_call_id, name, extra "
                    "FROM messages WHERE session_id = ? AND active = 1 AND id > ? ORDER BY id",
                    (session_id, watermark)).fetchall()]
            conn.execute("DELETE FROM messages WHERE session_id = ? AND active = 1", (session_id,))
            kept = [dict(self.row_to_message(row), _turn_id=row["turn_id"]) for row in tail]
            new_ids = self._insert_message_rows(conn, session_id, list(compacted_messages) + kept)
            probes.fire("compact.in_txn", session=session_id, watermark=watermark)
            return new_ids

        return self._execute_write(compact, session_id=session_id)

    SessionDB.archive_and_compact = delete_and_compact
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
