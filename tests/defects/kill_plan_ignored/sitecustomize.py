"""Deliberate defect: the worker announces its planned kill, then carries on.

Loaded only by worker processes (see `worker_only.is_worker`). At the probe hit its kill plan
names, the worker reports the hit with `kill` set, as it must, but neither kills itself nor
waits to be killed: it runs on. In the self-kill scenario it dies all the same a little later,
of SIGKILL, when its `restart_agent` tool kills its own process. A supervisor that counted
every SIGKILL death as its kill would take that death for the planned one and judge a case
whose planned kill never happened. The checker's `coverage` must see that the worker lived on
past the probe it announced (cause "self", not "nemesis") and answer "no-kill"; the campaign
counts that death under `other_deaths`, not `kills`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "kill-plan-ignored"


def _arm() -> None:
    from worker.link import ProbeWiring

    def announce_and_carry_on(self, name, context):
        with self._lock:
            self.counts[name] += 1
            occurrence = self.counts[name]
        plan = self.plan or (self.link.plan if self.link else None)
        kill = plan is not None and plan.probe == name and plan.occurrence == occurrence
        if self.link is not None:
            self.link.report({"type": "probe", "name": name, "n": occurrence, "ctx": context, "kill": kill,
                              "mode": plan.mode if kill and plan else None})

    ProbeWiring.__call__ = announce_and_carry_on
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
