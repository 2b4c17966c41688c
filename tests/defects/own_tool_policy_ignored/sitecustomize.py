"""Deliberate defect: the runtime ignores the policy a user's own tool declares.

Loaded only by worker processes (see `worker_only.is_worker`). Every tool declared with
``@tool`` outside this project (examples.notes_tools' ``add_note``, declared at_most_once, among
them) is looked up as idempotent, so its dispatch intent says idempotent and recovery reruns it
when a worker died after it ran. The tool's declaration is untouched, and the effects ledger
records each run under it: a campaign over the module (``chaos --tools examples.notes_tools``)
must report `effect-semantics` (an at-most-once tool run twice for one call).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "own-tool-policy-ignored"
OURS = ("hermes", "worker", "supervisor", "targetkit", "testkit")


def _arm() -> None:
    from hermes.tools import IDEMPOTENT, ToolRegistry

    original = ToolRegistry.policy

    def declared_policy_ignored(self, name):
        module = self._declared_in.get(name)
        if module is not None and module.partition(".")[0] not in OURS:
            return IDEMPOTENT
        return original(self, name)

    ToolRegistry.policy = declared_policy_ignored
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
