"""What the endpoint says about a model (context window), asked once and cached.

Nothing in the runtime asks it today: compaction is sized in rows (`--compact-above`), not by a
context window. The module stays because the seed contract patches `fetch_model_metadata` by
this path (upstream's `agent.model_metadata`); were compaction sized by the window, it would be
fetched lazily, so that starting an agent, and so recovering from a crash, never waits on it.
"""
from __future__ import annotations

import threading
from typing import Any

DEFAULT_CONTEXT_LENGTH = 128_000

_cache: dict[tuple[str, str], dict[str, Any]] = {}
_lock = threading.Lock()


def fetch_model_metadata(client: Any, model: str) -> dict[str, Any]:
    """`{"id", "context_length"}` for `model` from the endpoint's /models; {} if it cannot say."""
    key = (str(getattr(client, "base_url", "")), model)
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        entry = client.models.retrieve(model)
        extra = getattr(entry, "model_extra", None) or {}
        length = extra.get("context_length") or extra.get("context_window")
        meta = {"id": getattr(entry, "id", model),
                "context_length": int(length) if length else DEFAULT_CONTEXT_LENGTH}
    except Exception:  # metadata is advisory; a missing endpoint must not break a turn
        meta = {}
    with _lock:
        _cache[key] = meta
    return meta


def context_length(client: Any, model: str) -> int:
    return int(fetch_model_metadata(client, model).get("context_length") or DEFAULT_CONTEXT_LENGTH)
