"""Power cuts: the crash states below SIGKILL (``--faults power-loss``, ``--faults torn-write``).

A process kill leaves the kernel's page cache alone, so whatever a worker wrote survives it,
synced or not. A power cut does not. Under ``--faults power-loss`` each case keeps its state
directory (the session database with its WAL and -shm, the effects ledger, spilled results) on
a lazy file system (`nemesis.lazyfs`) that holds every write until it is fsynced, and every
kill the case's plan lands becomes a power cut (`PowerCuts.cut`):

1. every other process of the case is SIGKILLed too (the runner does it, by recorded pid);
2. the supervisor's own view is taken through the mount, as a process-kill world would see it;
3. the lazy file system applies a crash state to what was never made durable: drop it all
   (the common case), keep a prefix of it in issue order, keep a random subset (reordering),
   or, under ``torn-write``, keep a prefix that ends inside one write at a 512-byte boundary;
4. the mount is taken down and a fresh one mounted over the same backing directory, so no
   page the kernel cached of the old one can be read again; recovery then runs as after any
   crash.

A campaign keeps its lazy file system servers from case to case (`LazyFSServers`: about one
per job), so a case pays for a mount and an unmount, not for starting a server.

Which crash state a cut applies, and its seed, follow from the case id and the cut's index,
so a case's repro line cuts the same way again (`crash_plan`).
"""
from __future__ import annotations

import hashlib
import random
import signal
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.private_files import make_private_dirs
from hermes.state import StorageError
from supervisor.chaos.nemesis.family import FaultUnavailable, Nemesis
from supervisor.chaos.nemesis.lazyfs import LazyFS, LazyFSError, LazyFSServers, missing
from targetkit import registry

if TYPE_CHECKING:
    from supervisor.chaos.checker import Durable
    from supervisor.procs.pool import WorkerProcess

POWER_LOSS, TORN_WRITE = "power-loss", "torn-write"
POWER_FAULTS = (POWER_LOSS, TORN_WRITE)
# How often each crash state comes up without torn-write: dropping everything unsynced is what
# a real power cut does most of the time; prefixes and subsets are the reordering a disk may do.
CRASH_WEIGHTS = {"drop": 6, "prefix": 2, "subset": 2}


class PowerLossUnavailable(FaultUnavailable):
    """This machine cannot mount a lazy file system; says what to install."""


def wants_power_cuts(faults: tuple[str, ...] | list[str]) -> bool:
    """Does the campaign cut power (torn-write tears the writes of a power cut, so it implies one)?"""
    return any(name in POWER_FAULTS for name in faults)


def check_available(faults: tuple[str, ...] | list[str]) -> None:
    """Raise PowerLossUnavailable when `faults` asks for power cuts and FUSE is not usable here."""
    if not wants_power_cuts(faults):
        return
    lack = missing()
    if lack is not None:
        what, remedy = lack
        raise PowerLossUnavailable(f"--faults {'/'.join(n for n in POWER_FAULTS if n in faults)} runs every case on "
                                   f"a lazy FUSE file system, which cannot run here: {what}; {remedy}")


def crash_plan(case_id: str, index: int, torn: bool) -> tuple[str, int]:
    """(crash mode, seed) of the `index`-th power cut of case `case_id` (0-based)."""
    digest = hashlib.sha256(f"{case_id}#{index}".encode()).digest()
    seed = int.from_bytes(digest[:8], "big")
    if torn:
        return "torn", seed
    modes = list(CRASH_WEIGHTS)
    return random.Random(seed).choices(modes, weights=[CRASH_WEIGHTS[m] for m in modes])[0], seed


class PowerCuts:
    """One case's state directory on a lazy file system: `state` is the mount, `disk` what the
    disk holds. `mount()` before the case, `cut()` at each landed kill, `release()` after it."""

    def __init__(self, case_dir: Path, servers: LazyFSServers) -> None:
        self.disk = case_dir / "disk"
        self.state = case_dir / "state"
        self._servers = servers
        self._fs: LazyFS | None = None

    def mount(self) -> None:
        make_private_dirs(self.disk)
        make_private_dirs(self.state)
        server = self._servers.acquire()
        try:
            self._fs = LazyFS(self.disk, self.state, server=server).start()
        finally:
            if self._fs is None:
                self._servers.release(server)

    def cut(self, mode: str, seed: int) -> dict[str, Any]:
        """Cut the power now and bring a fresh mount up over what survived; returns the lazy file
        system's account of what was lost. Every process using the mount must be dead, and every
        connection of the supervisor's to its files closed."""
        if self._fs is None:
            raise LazyFSError("no lazy file system is mounted for this case")
        lost = self._fs.crash(mode, seed)
        self._fs.remount()
        return lost

    def release(self) -> None:
        """Unmount cleanly (what is still pending is written back, as a clean shutdown would) and
        leave the files where the mount showed them. Safe to call twice, and after a failure."""
        if self._fs is None:
            return
        fs, self._fs = self._fs, None
        fs.close()
        if fs.server is not None:
            self._servers.release(fs.server)
        try:
            self.state.rmdir()
            self.disk.rename(self.state)
        except OSError:
            pass  # a mount that would not go away keeps its files under disk/


def brief_crash(lost: dict[str, Any], limit: int = 8) -> dict[str, Any]:
    """What a cut lost, for the history: per file with anything pending, how many writes it had,
    kept and dropped, and at most `limit` dropped byte ranges."""
    files = []
    for item in lost.get("files", []):
        ranges = item.get("dropped_ranges") or []
        files.append({"path": item.get("path"), "writes": item.get("writes"), "kept": item.get("kept_writes"),
                      "dropped": item.get("dropped_writes"), "dropped_ranges": ranges[:limit],
                      **({"more_ranges": len(ranges) - limit} if len(ranges) > limit else {}),
                      **({"entry_removed": True} if item.get("entry_removed") else {}),
                      **({"dropped_truncates": item["dropped_truncates"]} if item.get("dropped_truncates") else {})})
    return {"mode": lost.get("mode"), "seed": lost.get("seed"), "dropped_writes": int(lost.get("dropped_writes") or 0),
            "removed_entries": list(lost.get("removed_entries") or []),
            "restored_entries": list(lost.get("restored_entries") or []),
            "undone_renames": list(lost.get("undone_renames") or []), "torn": lost.get("torn"), "files": files}


class PowerLoss(Nemesis):
    """`power-loss` and `torn-write`: the case's state lives on a lazy file system, and every kill
    its plan lands is a power cut under the whole case (`PowerCuts`)."""

    FAULTS = POWER_FAULTS
    NEVER_REACHED = "no planned kill landed"
    WHY_NOT_ON = ("it cuts the power under the case's files on a lazy file system, and a PostgreSQL server's "
                  "files are not the case's")

    def __init__(self, case: Any, chosen: tuple[str, ...], resource: Any = None) -> None:
        super().__init__(case, chosen, resource)
        if resource is None:
            raise ValueError("--faults power-loss needs the campaign's lazy file system servers")
        self.cuts = PowerCuts(case.dir, resource)
        self.count = 0

    @classmethod
    def check_available(cls, chosen: tuple[str, ...], faults: tuple[str, ...], workdir: Path) -> None:
        if "disk" in faults:
            raise FaultUnavailable("--faults disk puts each case on a tmpfs and power-loss on a lazy file system: "
                                   "one case directory cannot be both; run them in two campaigns")
        check_available(chosen)

    @classmethod
    def open_resource(cls, chosen: tuple[str, ...]) -> LazyFSServers:
        return LazyFSServers()  # kept from case to case: a server serves many mounts

    def state_dir(self) -> Path:
        return self.cuts.state

    def setup(self) -> None:
        self.cuts.mount()

    def teardown(self) -> None:
        self.case.observer.close()
        self.cuts.release()

    def on_kill(self, killed: WorkerProcess) -> bool:
        """The planned kill of `killed` landed: cut the power under the whole case. Every other
        process of the case dies with it; what the mount showed, what the cut lost, and what the
        disk holds afterwards go into one `power_cut` event (checker: power-cut-durability), and
        what it holds is the killed worker's exit snapshot."""
        from supervisor.chaos.checker import Durable
        from supervisor.chaos.checker.deaths import POWER_CUT
        from supervisor.chaos.checker.evidence import ledger_records
        from supervisor.chaos.history import snapshot_and_ask, summarize_rows

        case = self.case
        others = case.running_workers()
        for other in others:
            if other.kill(POWER_CUT):
                case.history.record("kill", incarnation=other.incarnation, pid=other.pid, signal=signal.SIGKILL,
                                    by=POWER_CUT, probe=None)
        for other in others:
            other.wait(case.config.process_timeout)
        case.observer.close()
        try:
            before, _ = snapshot_and_ask(case.db, None)
        except StorageError as exc:  # what the mount shows cannot be read: the cut is compared to nothing
            before = Durable(case.db, error=str(exc))  # and the checker says so (`before_error`)
        ledger_before = ledger_records(case.ledger)
        torn = TORN_WRITE in self.chosen
        mode, seed = crash_plan(case.case.case_id, self.count, torn)
        self.count += 1
        lost = brief_crash(self.cuts.cut(mode, seed))
        turn_index = case.turn_of(killed.incarnation)
        case.forget_seen()
        state: Any = case.UNREAD
        try:  # one copy of what survived: its integrity, and the exit snapshot's rows and turn state
            after, answer = snapshot_and_ask(case.db, lambda conn: (_integrity(conn),
                                                                    case.read_turn_state(conn, turn_index)))
            integrity, state = answer if answer is not None else ("no database", None)
        except StorageError as exc:
            after, integrity = Durable(case.db, error=str(exc)), [str(exc)]
        ledger_after = ledger_records(case.ledger)
        rows_before, rows_after = summarize_rows(before), summarize_rows(after)
        gone = {row_id: row for row_id, row in rows_before.items() if not _same_row(row, rows_after.get(row_id))}
        kept = [row_id for row_id in rows_before if row_id not in gone]
        turns_before, dispatches_before = summarize_turns(before), summarize_dispatches(before)
        case.history.record(
            "power_cut", incarnation=killed.incarnation, synchronous=case.config.synchronous, **lost,
            killed=[other.incarnation for other in others], serial_writes=case.target.name == registry.DEFAULT,
            rows_before=len(rows_before), rows_after=len(rows_after),
            lost_rows={str(k): v for k, v in sorted(gone.items())}, kept_max_id=max(kept, default=0),
            turns_before=len(turns_before), dispatches_before=len(dispatches_before),
            lost_turns=lost_turns(turns_before, summarize_turns(after)),
            lost_dispatches=sorted(set(dispatches_before) - set(summarize_dispatches(after))),
            # Tables the mount showed that the disk no longer has: the schema's commit is gone too.
            schema_lost=not before.missing and before.error is None and after.missing,
            before_error=before.error, integrity=integrity,
            ledger_lost=_ledger_lost(ledger_before, ledger_after, after),
            ledger_error=next((x for x in (ledger_before, ledger_after) if isinstance(x, str)), None))
        if after.error is None:
            case.record_snapshot("exit", after, turn_index, state)
        case.account(POWER_LOSS, landed=True)
        if torn:
            case.account(TORN_WRITE, landed=lost["torn"] is not None,
                         reason=None if lost["torn"] else "no unsynced write crossed a 512-byte sector boundary")
        return True


def _integrity(conn: sqlite3.Connection) -> str | list[str]:
    """PRAGMA integrity_check of a snapshot copy: "ok", or what it found wrong."""
    found = [str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall()]
    return "ok" if found == ["ok"] else found


def _ledger_lost(before: dict[str, str | None] | str, after: dict[str, str | None] | str,
                 survived: Durable) -> list[dict[str, Any]] | None:
    """The ledger's records the cut took, each with its tool call and whether that call's result
    survived in the transcript (the record was then committed before the result was, so before a
    commit that returned: a loss the ledger must not have). None when a side could not be read."""
    if isinstance(before, str) or isinstance(after, str):
        return None
    answered = {row.get("tool_call_id") for row in survived.rows if row.get("role") == "tool"}
    return [{"record": key, "tool_call_id": call, "answered": call is not None and call in answered}
            for key, call in sorted(before.items()) if key not in after]


def summarize_turns(state: Durable) -> dict[str, dict[str, Any]]:
    """Turn id -> what a commit may change of it (its session, state, attempts, model calls)."""
    return {str(t.get("id")): {"session": t.get("session_id"), "state": t.get("state"),
                               "attempts": t.get("attempts"), "model_calls": t.get("model_calls")}
            for t in state.turns}


def summarize_dispatches(state: Durable) -> list[str]:
    """Each dispatch intent as one comparable key: session/turn/tool call#attempt."""
    return [f"{d.get('session_id')}/{d.get('turn_id')}/{d.get('tool_call_id')}#{d.get('attempt')}"
            for d in state.dispatches]


def lost_turns(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The turns whose row, or a change to it, the cut took: with nobody running between the two
    reads, any difference is the cut's doing ("after" None: the row itself is gone)."""
    return {turn: {"before": row, "after": after.get(turn)} for turn, row in sorted(before.items())
            if after.get(turn) != row}


def _same_row(before: dict[str, Any], after: dict[str, Any] | None) -> bool:
    """Is `after` the row `before` was (a later archive or blank repair aside)?"""
    return after is not None and all(before.get(k) == after.get(k) for k in ("session", "turn", "role", "digest"))
