"""Deliberate defect: compaction's watermark is one row too early.

Loaded only by worker processes (see `worker_only.is_worker`). `archive_and_compact` clones back,
after the summary, the active rows past its watermark: the kept turn's, from its question on. Here
the watermark is moved to the active row before it, the classic off-by-one, so the older turn's last
row (its final answer) is cloned back beside the newest turn's rows. Nothing is lost and every
block is whole, but the model is shown that answer twice, once summarized and once as itself: the
rows a compaction kept are no longer one turn's (`well-formed`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "compaction-keeps-older"


def _arm() -> None:
    from hermes.state import SessionDB

    original = SessionDB.archive_and_compact

    def compact_from_one_row_earlier(self, session_id, compacted_messages, watermark=None):
        if watermark is not None:
            ids = [m["_row_id"] for m in self.load_live_messages(session_id) if m["_row_id"] < watermark]
            watermark = ids[-1] if ids else watermark
        return original(self, session_id, compacted_messages, watermark=watermark)

    SessionDB.archive_and_compact = compact_from_one_row_earlier
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
