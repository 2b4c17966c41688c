"""`python -m bench --only recovery --profile DIR`: where each process of a recovery spends its time.

A recovery spans three kinds of process, each profiled the way it can be:

- the supervisor (this process: the reaper, the spawn, the channel readers, the scripted model
  server) and the warm template (between a request and its fork): py-spy, attached to each by
  its recorded pid for the fork-server cycles, sampling only threads that are not idle, written
  as collapsed stacks (`supervisor.txt`, `template.txt`);
- each forked worker: it profiles itself with pyinstrument from just after its fork to its
  exit (worker.forkserver, `HERMES_WORKER_PROFILE`), since a sampler attached from outside
  would miss its first milliseconds; the resumed workers' profiles are combined into one
  call tree (`worker-resume.txt`; a killed worker saves none).

`summary.txt` holds the top lines of each. The profilers slow what they watch (the samplers
most on a loaded machine): read the profiles for where the time goes, the table for how much.
"""
from __future__ import annotations

import collections
import itertools
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hermes.extras import install_line

PROFILE_ENV = "HERMES_WORKER_PROFILE"  # worker.forkserver reads it
RATE = 1000  # samples per second of each py-spy
TOP = 25


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter, else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def unavailable(samplers: bool = True) -> str | None:
    """Why --profile (`samplers`: py-spy too; else the workers' own profiles alone) cannot run here, or None."""
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        return f"pyinstrument is not installed: {install_line('bench')}"
    if samplers and py_spy() is None:
        return f"py-spy is not installed: {install_line('bench')}"
    return None


class Profiling:
    """The profilers of one run of fork-server recovery cycles, writing into `directory`.
    `samplers=False`: the workers profile themselves and nothing is attached to the others
    (pyinstrument alone; what `held_by` reads)."""

    def __init__(self, directory: Path, *, samplers: bool = True) -> None:
        self.dir = Path(directory)
        self.workers = self.dir / "workers"
        self.workers.mkdir(parents=True, exist_ok=True)
        self.samplers = samplers
        self._samplers: dict[str, subprocess.Popen[bytes]] = {}

    def env(self) -> dict[str, str]:
        """What the pool's template must have in its environment for its workers to profile themselves."""
        return {PROFILE_ENV: str(self.workers)}

    def attach(self, name: str, pid: int) -> None:
        """Sample process `pid` into `NAME.txt` until `detach` (with `samplers`)."""
        if not self.samplers:
            return
        exe = py_spy()
        assert exe is not None
        with open(self.dir / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
            self._samplers[name] = subprocess.Popen(
                [exe, "record", "--pid", str(pid), "--rate", str(RATE), "--format", "raw", "--nonblocking",
                 "--threads", "-o", str(self.dir / f"{name}.txt")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)

    def detach(self) -> None:
        """Stop every sampler by its recorded pid (SIGINT: py-spy then writes its file) and reap it."""
        for proc in self._samplers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self._samplers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._samplers.clear()

    def summarize(self) -> str:
        parts = [_collapsed_summary(self.dir / f"{name}.txt", name) for name in ("supervisor", "template")]
        parts.append(_worker_summary(self.workers, self.dir / "worker-resume.txt"))
        text = "\n\n".join(parts)
        (self.dir / "summary.txt").write_text(text + "\n", encoding="utf-8")
        return text


def _frame_name(frame: str) -> str:
    """'function (path/to/module.py:123)' -> 'function (module.py)'; thread ids stay as they are."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    return f"{name} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})"


def _collapsed_summary(path: Path, name: str) -> str:
    """Top self and inclusive frames of py-spy's collapsed stacks (one `a;b;c COUNT` a line)."""
    if not path.exists():
        return f"== {name}: no samples ({path.name} missing; see {name}.log)"
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_name(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    ms = 1000 / RATE
    lines = [f"== {name}: {total} samples at {RATE}/s (~{total * ms:.0f} ms of non-idle thread time; a thread "
             "blocked in a system call may count as busy)"]
    for title, counts in (("self", own), ("inclusive", inclusive)):
        lines.append(f"-- {title} time (top):")
        lines += [f"  {n * ms:8.1f} ms  {n / total:6.1%}  {frame}" for frame, n in counts.most_common(TOP)]
    return "\n".join(lines)


def _worker_summary(directory: Path, out: Path) -> str:
    from pyinstrument.renderers import ConsoleRenderer
    from pyinstrument.session import Session

    # Only workers that exit save a profile: the resumed ones (the first of each cycle is killed).
    resumed = [Session.load(str(p)) for p in sorted(directory.glob("worker-*.pyisession"))]
    if not resumed:
        return f"== workers: no resumed worker's profile in {directory}"
    combined = resumed[0]
    for session in resumed[1:]:
        combined = Session.combine(combined, session)
    renderer = ConsoleRenderer(unicode=False, color=False, show_all=False, time="seconds")
    tree = renderer.render(combined)
    out.write_text(tree, encoding="utf-8")
    per = combined.duration / len(resumed) * 1000
    lines = [f"== workers: {len(resumed)} resumed workers combined, {per:.1f} ms each on average "
             f"(pyinstrument, from the fork to the exit; whole tree in {out.name})"]
    lines += _top_functions(combined.root_frame(), len(resumed))
    return "\n".join(lines)


Code = tuple[str, str]  # (function, file name): a frame pyinstrument recorded, e.g. ("_open_db", "hermes.py")


@dataclass(frozen=True)
class Held:
    """Where the profiled workers (or other profiled units: `unit`) spent a stage's time: the heaviest
    of the stage's entry frames (inclusive) and, anywhere under them, the line with the most self time."""
    profiled: int  # how many units' profiles
    entry: str
    entry_ms: float
    line: str
    line_ms: float
    unit: str = "worker"

    def describe(self) -> str:
        return (f"its heaviest profile line, pyinstrument over {self.profiled} profiled {self.unit}s: `{self.entry}` "
                f"{self.entry_ms:.2f} ms per {self.unit}, most of it in `{self.line}` {self.line_ms:.2f} ms")


def held_by(directory: Path, entries: Sequence[Code], unit: str = "worker") -> Held | None:
    """`Held` for the stage whose code starts at the frames `entries`, from the profiles of `unit`s
    in `directory` (`UNIT-*.pyisession`; None: no profile, or none of those frames was sampled)."""
    from pyinstrument.session import Session

    sessions = [Session.load(str(p)) for p in sorted(Path(directory).glob(f"{unit}-*.pyisession"))]
    if not sessions:
        return None
    combined = sessions[0]
    for session in sessions[1:]:
        combined = Session.combine(combined, session)
    wanted = set(entries)
    inclusive: collections.Counter[str] = collections.Counter()
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def name(frame: Any) -> str:
        return f"{frame.function} ({Path(frame.file_path_short or '?').name}:{frame.line_no})"

    def below(frame: Any, entry: str, caller: str) -> None:  # inside a stage: every line's self time
        # What its named callees did not take; pyinstrument's synthetic children ("[self]", time in C
        # code it could not name) are the frame's own. A C function is named with the nearest frame of
        # our code above it: `Cursor.execute` or `poll` alone does not say which step waits.
        named = [child for child in frame.children if not child.function.startswith("[")]
        here = name(frame)
        line = f"{here} from {caller}" if "<built-in>" in here else here
        own[entry][line] += frame.time - sum(child.time for child in named)
        ours = here if getattr(frame, "is_application_code", False) else caller
        for child in named:
            below(child, entry, ours)

    def walk(frame: Any) -> None:  # outside: look for the stage's entry frames
        if (frame.function, Path(frame.file_path_short or "?").name) in wanted:
            entry = name(frame)
            inclusive[entry] += frame.time
            below(frame, entry, entry)
            return
        for child in frame.children:
            walk(child)

    root = combined.root_frame()
    if root is not None:
        walk(root)
    if not inclusive:
        return None
    (entry, entry_s), = inclusive.most_common(1)
    (line, line_s), = own[entry].most_common(1)
    n = len(sessions)
    return Held(n, entry, entry_s * 1000 / n, line, line_s * 1000 / n, unit)


@contextmanager
def timed_calls(owner: Any, attr: str, seconds: list[float], profile_into: Path | None = None,
                unit: str = "call") -> Iterator[None]:
    """For the block, append to `seconds` how long each call of `owner.attr` takes, from any thread;
    with `profile_into`, each call also profiles itself (pyinstrument, in the thread that made it)
    into `profile_into/UNIT-N.pyisession`, what `held_by(profile_into, ..., unit)` reads."""
    original = getattr(owner, attr)
    lock = threading.Lock()
    numbers = itertools.count()

    def timed(*args: Any, **kwargs: Any) -> Any:
        profiler = None
        if profile_into is not None:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0002, async_mode="disabled")
            profiler.start()
        started = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            took = time.monotonic() - started
            with lock:
                seconds.append(took)
                number = next(numbers)
            if profiler is not None and profile_into is not None:
                profiler.stop().save(str(profile_into / f"{unit}-{number}.pyisession"))

    setattr(owner, attr, timed)
    try:
        yield
    finally:
        setattr(owner, attr, original)


def profile_line(bench_dir: Path, entries: Sequence[Code], run_pass: Callable[[Profiling], object],
                 profile: Profiling | None = None, unit: str = "worker") -> str:
    """`Held.describe()` of the code starting at `entries`: from `profile`, else from a pass that
    `run_pass` makes into a new workers-only profile under `bench_dir` (a pass profiling other
    `unit`s, e.g. with `timed_calls`, saves them in its `workers` directory too); or why there is none."""
    why_not = unavailable(samplers=False)
    if why_not is not None:
        return f"no profile line: {why_not}"
    if profile is None:
        profile = Profiling(Path(tempfile.mkdtemp(prefix="profile-", dir=bench_dir)), samplers=False)
        run_pass(profile)
    line = held_by(profile.workers, entries, unit)
    return line.describe() if line is not None else "the profile sampled none of its code"


def _top_functions(root: Any, workers: int) -> list[str]:
    """Inclusive ms per worker of each function (counted once per stack), the top ones."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()

    def walk(frame: Any, seen: frozenset[str]) -> None:
        name = f"{frame.function} ({Path(frame.file_path_short or '?').name}:{frame.line_no})"
        if name not in seen:
            inclusive[name] += frame.time
        own[name] += frame.total_self_time
        for child in frame.children:
            walk(child, seen | {name})

    if root is not None:
        walk(root, frozenset())
    lines = ["-- inclusive ms per worker (top):"]
    lines += [f"  {t * 1000 / workers:8.2f} ms  {name}" for name, t in inclusive.most_common(TOP + 15)]
    lines.append("-- self ms per worker (top):")
    lines += [f"  {t * 1000 / workers:8.2f} ms  {name}" for name, t in own.most_common(TOP)]
    return lines
