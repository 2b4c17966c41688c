"""Model faults: the scripted model misbehaves (``--faults http500,...`` and ``refused``).

The first six are served by the scripted model itself: each distinct request is first
answered with one of the chosen faults, once. http500, http429, truncate (a cut body) and
stall (no answer within the worker's timeout) are transient: the SDK's retries must absorb
them without a duplicate row. not_json and empty_choices are not retried: the turn must
end `failed` with its reason recorded and the transcript well-formed, and the next turn
runs normally. `refused`: the first worker restarted after a kill is given a model URL
that refuses every connection; its turn must end failed, named `model_error:connection`.
"""
from __future__ import annotations

import dataclasses
import socket
import threading
import zlib
from typing import Any

from supervisor.chaos.nemesis.family import PER_CAMPAIGN, Nemesis
from testkit.script import Reply, Script, request_key

MODEL_FAULTS = ("http500", "http429", "truncate", "stall", "not_json", "empty_choices")
UNRETRIED = ("not_json", "empty_choices")  # the request fails: a compaction's summary request too
STALL_WORKER_TIMEOUT_S = 1.0  # the worker's request timeout when `stall` is on (else 20 s)
STALL_S = 1.5  # how long a stalled request hangs: past that timeout, so the SDK retries

_refuser: socket.socket | None = None
_refuser_lock = threading.Lock()


def refusing_url() -> str:
    """A loopback model URL that refuses every connection: a port this process keeps bound
    (so nothing else can take it) and never listens on."""
    global _refuser
    with _refuser_lock:
        if _refuser is None:
            _refuser = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            _refuser.bind(("127.0.0.1", 0))
        port = _refuser.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def with_model_faults(script: Script, faults: list[str]) -> Script:
    """`script`, but each distinct request is first answered with one of `faults`, once.

    Which fault a request meets depends on its content only, never on arrival order, so the
    fault-free baseline of a scenario and every case derived from it see the same faults.
    """
    if not faults:
        return script

    def faulty(messages: list[dict[str, Any]]) -> Reply:
        reply = script(messages)
        fault = faults[zlib.crc32(request_key(messages).encode()) % len(faults)]
        # The server serves a fault `fault_times` times for one exact request, then answers.
        return dataclasses.replace(reply, fault=fault, fault_times=1, retry_after=0.05, stall_seconds=STALL_S)

    return faulty


class ModelFaults(Nemesis):
    """The scripted model's own faults, served once per distinct request (counted per campaign)."""

    FAULTS = MODEL_FAULTS
    PLANNED = PER_CAMPAIGN
    STORES = ("sqlite", "postgres")  # the model's faults never touch the store

    @classmethod
    def model_script(cls, script: Script, chosen: tuple[str, ...]) -> Script:
        return with_model_faults(script, list(chosen))

    def setup(self) -> None:
        # The case's record that a request of its workers may fail for good (the checker excuses a
        # compaction skipped for want of a summary: supervisor.chaos.checker.compaction).
        failing = [fault for fault in self.chosen if fault in UNRETRIED]
        if failing:
            self.case.history.record("model_fault", faults=failing)

    def worker_timeout(self, seconds: float) -> float:
        return STALL_WORKER_TIMEOUT_S if "stall" in self.chosen else seconds


class RefusedModel(Nemesis):
    """`refused`: the first worker started again after a kill finds the model refusing connections."""

    FAULTS = ("refused",)
    NEVER_REACHED = "no worker was started again after a kill"
    STORES = ("sqlite", "postgres")  # the model's endpoint only

    done = False

    def model_url(self, url: str) -> str:
        if self.done or self.case.sigkills == 0:
            return url
        self.done = True
        refused = refusing_url()
        self.case.history.record("model_fault", fault="refused", url=refused)
        self.case.account("refused", landed=True)
        return refused
