"""Deliberate defect: starting a turn commits the turn row and the user message separately.

Loaded only by worker processes (see `_is_worker`). `SessionDB.write_pending` with
`start_turn` must create the 'running' turn row and insert the user message in ONE
transaction. Here the turn row is committed alone (a flush transaction of its own,
so it has its own flush probes), then the messages in a second transaction. A kill
between the two leaves a running turn whose user message never became durable; the
resumed turn then talks to the model without it.
"""
import sys

DEFECT = "split-turn-commit"


def _is_worker() -> bool:
    """True in `python -m worker ...` and in a worker template (`python -m worker.forkserver`,
    whose forks inherit the patch); False in the supervisor and everywhere else."""
    # At start-up sys.argv is ['-m', ...] without the module name; orig_argv keeps it.
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return any(a == "-m" and (b == "worker" or b.startswith("worker.")) for a, b in zip(argv, argv[1:]))


def _arm() -> None:
    from hermes.state import SessionDB

    original = SessionDB.write_pending

    def write_in_two_transactions(self, session_id, pending, *, start_turn=None, probe_context=None):
        if start_turn is None:
            return original(self, session_id, pending, probe_context=probe_context)

        def turn_row_only(conn):
            self._start_turn_row(conn, session_id, start_turn, pending)

        self._execute_write(turn_row_only, probe="flush", session_id=session_id, probe_context=probe_context)
        return original(self, session_id, pending, probe_context=probe_context)

    SessionDB.write_pending = write_in_two_transactions
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if _is_worker():
    _arm()
