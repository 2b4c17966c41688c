"""The daemon's event stream survives a power cut: every event a client received stays.

The real daemon (`serve --http 127.0.0.1:0`, built-in scripted model, `synchronous=FULL`)
keeps its whole state directory (database, token, status, lock, message files, effects
ledger, HERMES_HOME) on a lazy file system (`supervisor.chaos.nemesis.lazyfs`), which keeps
in memory whatever was never fsynced. A client submits turns (each makes a tool call) and
reads the session's events over SSE. At three events (mid-turn after a tool result; after an
answer, a turn queued behind it; after a turn's end, the daemon idle) the test cuts the power
and goes on with the next turns after a restart. A cut freezes the daemon (SIGSTOP to its
process group, so it starts and records nothing more), SIGKILLs every process it started by
recorded pid (each worker with its own session's group), then the daemon, then crashes the
lazy file system (`subset`, `prefix`, then `drop`; fixed seeds) and unmounts it. Two reads
then judge each cut:

* the next boot: the session's feed (`SessionFeed`, the code the HTTP API streams) read
  from the backing directory as it survived (an `open_snapshot` copy, nothing changed),
  before any daemon ran again. Every event received must be there, same id, same content.
  This is the read that can see a lost event: the built-in model is deterministic and row
  ids are reused after a lost commit, so a turn rerun after recovery writes back events
  identical to the lost ones;
* the recovery: the daemon restarted on a fresh mount of the same backing directory resumes
  the interrupted turns; a new stream from the start (the token file unchanged) must again
  hold every event received so far, identically, in increasing id order, with every turn
  ending 'done'. At the end the transcript must be well-formed and the daemon must stop
  cleanly with nothing it started left.

The same run with the planted defect `tests/defects/daemon_event_before_sync` (workers commit
at `synchronous=NORMAL`) must fail the next-boot read of its last cut, and the same run with
plain SIGKILLs and no cut must pass both reads: only a power cut can see that defect.

Without FUSE (no /dev/fuse, no fusermount3, no libfuse 3, no mfusepy) the tests are skipped
with the reason, except in CI (CI=true), where they fail: there that is a broken machine.
"""
from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
import pytest
from fuseutil import lazy_mount, require_fuse

from bench.api import ApiClient, Event, EventStream, HttpDaemon
from hermes.private_files import fsync_dir
from hermes.state import open_snapshot
from supervisor.chaos.nemesis.lazyfs import LazyFS, is_mounted
from supervisor.daemon import inbox
from supervisor.daemon.events import SessionFeed
from supervisor.procs.pool import child_env

from daemon_helpers.harness import assert_well_formed, wait_for  # isort: skip

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

DEFECT = Path(__file__).resolve().parent / "defects" / "daemon_event_before_sync"
DEFECT_MARKER = "defect armed: daemon-event-before-sync"
SESSION = "power-cut"
STREAM_TIMEOUT_S = 20.0  # a read of the event stream that gets no byte for this long fails
ENDS = ("turn_done", "turn_failed")



Key = tuple[int, str, str]  # an event as a client can compare it: id, kind, its data as canonical JSON


def key(event_id: int, kind: str, data: dict) -> Key:
    return event_id, kind, json.dumps(data, sort_keys=True, ensure_ascii=False)


def lost_or_changed(received: dict[int, Key], found: list[Key]) -> list[str]:
    """What of `received` (id -> event) `found` does not hold as it was received."""
    by_id = {k[0]: k for k in found}
    problems = []
    for event_id, event in sorted(received.items()):
        if event_id not in by_id:
            problems.append(f"event {event_id} ({event[1]}) is missing: {event[2]}")
        elif by_id[event_id] != event:
            problems.append(f"event {event_id} changed: received {event[1:]}, now {by_id[event_id][1:]}")
    return problems


def all_gone(pid: int, created: float) -> bool:
    """Whether the recorded process is gone with all its threads. A killed process's first thread
    shows as a zombie while the others may still be on their way out, holding its open files (and
    with them the mount, which a clean unmount then finds busy)."""
    if inbox.process_alive(pid, created):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE or round(abs(proc.create_time() - created)) > 1:
            return True  # reaped, and the pid is another process's now
        return proc.num_threads() <= 1
    except psutil.Error:  # reaped
        return True


@dataclass(frozen=True)
class Cut:
    """One stretch of the run: submit `messages`, read events until the first turn's `at` event,
    then cut the power (`mode` of the lazy file system's crash; None: SIGKILL only, no cut)."""
    messages: tuple[str, ...]
    at: str
    mode: str | None
    seed: int = 0


@dataclass
class Outcome:
    first_boot: list[list[str]] = field(default_factory=list)  # per cut: what the next boot lost or changed
    recovered: list[list[str]] = field(default_factory=list)   # per restart: what its stream lost or changed
    cut_events: list[int] = field(default_factory=list)        # per cut: the id of the event it was made at
    logs: str = ""


class PowerRig:
    """A lazy mount holding the daemon's state directory, the daemons run on it, and every process they started."""

    def __init__(self, root: Path, defect: Path | None = None, synchronous: str = "FULL") -> None:
        self.root = root
        self.synchronous = synchronous
        self.backing, self.mnt, self.fs = lazy_mount(root)
        self.state = self.mnt / "state"
        try:
            self.state.mkdir()
            fsync_dir(self.mnt)  # the state directory exists durably before the daemon starts, as in production
        except BaseException:
            self.fs.close()
            raise
        self.db = self.state / "state.db"
        self.env = child_env({"HERMES_HOME": str(self.state / "home")})
        if defect is not None:
            self.env["PYTHONPATH"] = os.pathsep.join([str(defect), self.env["PYTHONPATH"]])
        self.daemons: list[HttpDaemon] = []
        self.daemon: HttpDaemon | None = None
        self.token: str | None = None

    # ------------------------------------------------------------ processes
    def start(self) -> ApiClient:
        daemon = HttpDaemon(self.db, self.root / "daemon.log", "--workers", "1", "--backoff-base", "0.05",
                            "--backoff-max", "0.2", "--synchronous", self.synchronous, env=self.env)
        self.daemons.append(daemon)
        self.daemon = daemon
        if self.token is None:
            self.token = daemon.token
        assert daemon.token == self.token, "the API token changed: a client that kept it is locked out"
        return daemon.client(timeout=STREAM_TIMEOUT_S)

    def kill_everything(self) -> None:
        """SIGKILL the daemon and all it started, by recorded pid, as at a power cut (nothing shuts down).

        Everything is stopped before anything is killed. A process that dies hands its children to
        init, out of the daemon's tree: a worker the fork server made just before the server's kill
        would escape every later look, live on, keep the mount busy, and turn the clean unmount of
        a cut without power loss into the lazy file system's death (its unsynced writes with it). A
        stopped process neither forks nor exits, so stopping whatever each look finds, until a look
        finds nothing new, leaves the whole tree in view."""
        daemon = self.daemon
        assert daemon is not None
        os.killpg(daemon.pid, signal.SIGSTOP)  # it starts no worker and writes nothing more from here
        status = daemon.status()  # the workers and templates it recorded
        recorded = {(p["pid"], p["create_time"]) for p in [*status.get("workers", []), *status.get("templates", [])]}
        stopped: dict[int, float] = {}
        while True:
            daemon.note_children()
            new = {pid: created for pid, created in [*daemon.seen.items(), *recorded] if pid not in stopped}
            if not new:
                break
            for pid, created in new.items():
                if inbox.process_alive(pid, created):
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except OSError:
                        pass
                stopped[pid] = created
        for pid, created in stopped.items():
            if inbox.process_alive(pid, created):
                try:
                    if os.getpgid(pid) == pid:  # a worker leads its own session: with its tools' children
                        os.killpg(pid, signal.SIGKILL)
                    else:  # e.g. forked a moment ago, before its setsid()
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        daemon.kill()  # the daemon's own group, reaped
        wait_for("every process the daemon started to be gone, every thread of it",
                 lambda: not [pid for pid, created in stopped.items() if not all_gone(pid, created)], timeout=10)
        self.daemon = None

    # ------------------------------------------------------------ the file system
    def cut(self, mode: str | None, seed: int) -> None:
        """Kill everything, then cut the power (None: no cut, the unmount writes everything back), and unmount."""
        self.kill_everything()
        if mode is None:
            self.fs.unmount()  # clean, or an error saying why: never the server's death, which loses writes
        else:
            report = self.fs.crash(mode, seed=seed)
            assert report["mode"] == mode
            self.fs.close()
        assert not is_mounted(self.mnt)

    def remount(self) -> None:
        self.fs = LazyFS(self.backing, self.mnt).start()

    def next_boot_events(self, session: str) -> list[Key]:
        """The session's feed as the next boot finds it: read from the backing directory (no mount up),
        through a copy that changes nothing."""
        assert not is_mounted(self.mnt)
        conn = open_snapshot(self.backing / "state" / "state.db")
        try:
            feed, out = SessionFeed(conn, session), []
            while batch := feed.poll():
                out += [key(e.id, e.kind, e.data) for e in batch]
            return out
        finally:
            conn.close()

    def logs(self) -> str:
        path = self.root / "daemon.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Kill whatever is left by recorded pid, wait until it is gone, and unmount."""
        try:
            for daemon in self.daemons:
                daemon.kill()
                daemon.survivors()
            wait_for("every process the daemons started to be gone",
                     lambda: not [pid for d in self.daemons for pid, created in d.seen.items()
                                  if inbox.process_alive(pid, created)], timeout=10)
        finally:
            self.fs.close()


@pytest.fixture
def rigs(tmp_path: Path) -> Iterator[list[PowerRig]]:
    require_fuse()
    made: list[PowerRig] = []
    try:
        yield made
    finally:
        for rig in made:
            rig.close()
    for rig in made:
        assert not rig.fs.running and not is_mounted(rig.mnt)


# ------------------------------------------------------------------ the scenario
def read_until(stream: EventStream, received: dict[int, Key], order: list[int], done: Callable[[Event], bool]) -> Event:
    """Read events into `received` (and their ids into `order`) up to the first one `done` accepts."""
    while True:
        event = stream.next()
        received[event.id] = key(event.id, event.kind, event.data)
        order.append(event.id)
        if done(event):
            return event


class Scenario:
    """A client of the daemons of one rig: what it received (by id), the turns it submitted, what each cut cost."""

    def __init__(self, rig: PowerRig) -> None:
        self.rig = rig
        self.received: dict[int, Key] = {}
        self.turns: list[str] = []
        self.outcome = Outcome()

    def connect(self) -> tuple[ApiClient, EventStream, list[int]]:
        """Start the daemon and stream the session from its start; once turns were submitted, read it
        until every one ended (the recovery) and note what of the events received earlier it lacks."""
        client = self.rig.start()
        stream = client.events(SESSION, 0, timeout=STREAM_TIMEOUT_S)
        order: list[int] = []
        if self.turns:
            ended: set[str] = set()

            def all_ended(event: Event) -> bool:
                if event.kind in ENDS:
                    ended.add(event.data["turn_id"])
                return ended >= set(self.turns)

            replay: dict[int, Key] = {}
            read_until(stream, replay, order, all_ended)
            self.outcome.recovered.append(lost_or_changed(self.received, list(replay.values())))
            self.received.update(replay)
        return client, stream, order

    def submit(self, client: ApiClient, text: str) -> str:
        self.turns.append(f"turn-{len(self.turns)}")
        client.submit(SESSION, text, self.turns[-1])
        return self.turns[-1]

    def cut(self, cut: Cut) -> None:
        """Submit the cut's turns, read up to its event, cut, and read what the next boot finds."""
        client, stream, order = self.connect()
        try:
            first = [self.submit(client, text) for text in cut.messages][0]
            at = read_until(stream, self.received, order, lambda e: e.kind == cut.at and e.data["turn_id"] == first)
            assert order == sorted(set(order)), f"event ids out of order or repeated: {order}"
            self.outcome.cut_events.append(at.id)
        finally:
            stream.close()
        self.rig.cut(cut.mode, cut.seed)
        self.outcome.first_boot.append(lost_or_changed(self.received, self.rig.next_boot_events(SESSION)))
        self.rig.remount()

    def finish(self, final: str | None) -> None:
        """The last start: every turn ends 'done' (and `final`, if any, runs after the cuts), the
        transcript is well-formed, and the daemon stops cleanly with nothing it started left."""
        client, stream, order = self.connect()
        try:
            if final is not None:
                turn = self.submit(client, final)
                read_until(stream, self.received, order, lambda e: e.kind in ENDS and e.data["turn_id"] == turn)
            assert order == sorted(set(order)), f"event ids out of order or repeated: {order}"
        finally:
            stream.close()
        for turn in self.turns:
            state = client.turn(turn)
            assert state["state"] == "done", state
        assert_well_formed(self.rig.db, SESSION)
        daemon = self.rig.daemon
        assert daemon is not None
        code = daemon.stop(timeout=60)
        assert code == 0, f"the daemon exited {code}: {daemon.log_tail()}"
        assert daemon.survivors() == [], "processes the daemon started survived it"
        self.rig.daemon = None
        self.outcome.logs = self.rig.logs()


def run(rig: PowerRig, cuts: list[Cut], final: str | None) -> Outcome:
    scenario = Scenario(rig)
    for cut in cuts:
        scenario.cut(cut)
    scenario.finish(final)
    return scenario.outcome


# ------------------------------------------------------------------ the tests
CUTS = [
    Cut(("look up the first thing",), at="tool_result", mode="subset", seed=7),  # mid-turn, after the tool ran
    Cut(("a second question", "and a third"), at="answer", mode="prefix", seed=5),  # the answer; a turn queued
    Cut(("the fourth one",), at="turn_done", mode="drop"),  # the turn ended; nothing queued, the daemon idle
]
FINAL = "after the power cuts"


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_every_event_received_survives_power_cuts_mid_turn_and_after_the_answer(
        rigs: list[PowerRig], tmp_path: Path, synchronous: str) -> None:
    """At FULL every event's row was fsynced before the daemon could read it. At NORMAL a power cut
    may take the last commits, so the daemon fsyncs the WAL before it sends what it read: an event
    a client received is never taken back, at either level."""
    rig = PowerRig(tmp_path, synchronous=synchronous)
    rigs.append(rig)

    outcome = run(rig, CUTS, FINAL)

    assert outcome.first_boot == [[] for _ in CUTS], outcome.first_boot
    assert outcome.recovered == [[] for _ in CUTS], outcome.recovered


@pytest.mark.parametrize("power_cut", [True, False], ids=["power-cut", "kill-9-only"])
def test_the_unsynced_event_defect_is_seen_by_a_power_cut_only(
        rigs: list[PowerRig], tmp_path: Path, power_cut: bool) -> None:
    """The same run with workers committing at NORMAL. Its last cut comes once a turn ended with
    nothing queued: the worker's last rows (the answer, the turn's end) follow its last barrier commit
    (fsynced at any level) and no commit of the daemon's FULL connection fsynced the WAL after them,
    so they are always pending there. Without the power cuts (SIGKILL, then a clean unmount) nothing
    is lost."""
    rig = PowerRig(tmp_path, defect=DEFECT)
    rigs.append(rig)

    outcome = run(rig, CUTS if power_cut else [replace(cut, mode=None) for cut in CUTS], FINAL)

    assert DEFECT_MARKER in outcome.logs, "the defect was not armed in the workers"
    if power_cut:
        lost = outcome.first_boot[-1]
        assert any(p.startswith(f"event {outcome.cut_events[-1]} (turn_done) is missing") for p in lost), lost
        assert any(" (answer) is missing" in p for p in lost), lost
    else:
        assert outcome.first_boot == [[] for _ in CUTS], outcome.first_boot
        assert outcome.recovered == [[] for _ in CUTS], outcome.recovered
