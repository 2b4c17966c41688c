"""The nemesis: what goes wrong in a case, and the names of every fault.

A case has at most one kill plan, a `Fault`, aimed at one worker process of the case:
the `process`-th process (0-based) started for turn `turn` of the scenario. Kinds:

    probe   SIGKILL at the n-th hit of a probe; mode `self` (the worker kills itself)
            or `external` (the worker reports and waits; the supervisor kills it by pid)
    timer   SIGKILL from the supervisor `delay_ms` after the process started; a timer of a
            random plan is aimed (`aim`, in basis points) at a share of the live span that the
            scenario's fault-free run measured, and its label names the share, not the
            milliseconds, so that the plan is the same in every process that derives it
    pause   SIGSTOP at a probe, let a fresh worker take the session over, then SIGCONT:
            the old worker must fail its next write on the fencing epoch
    interrupt  SIGINT at the n-th hit of a probe, sent by the worker to itself (a user's Ctrl-C):
            the turn must answer what it cut off truthfully, and the worker ends on SIGINT; the
            turn is then resumed like a killed one

`then` is a second fault for the first recovery process (double kills). A fault
prints as a stable label, and the label parses back, so a case can be rerun from it.

On top of its kill plan, every case of a campaign may meet the faults named by
``--faults`` (`nemesis.family.fault_names()`). Each family of them is one class (`nemesis.family.Nemesis`:
the hooks of a case it acts at), found through the entry points `hermes_supervisor.faults`:

* model faults (`nemesis.model`): the scripted model answers each distinct request wrongly
  once; `refused`: the first worker restarted after a kill finds the model endpoint
  refusing connections;
* storage faults (`nemesis.storage`): `locked` and `busy` (another connection holds the write
  lock at the first tool effect, past the worker's busy budget or for part of it), and `disk`,
  `readonly`, `corrupt` (the storage breaks while no worker runs);
* power cuts (`nemesis.powerloss`): `power-loss` runs each case on a lazy file system and makes
  every kill its plan lands a power cut (what was never fsynced is dropped, kept as a prefix or
  as a random subset); `torn-write` tears one unsynced write of each cut at a 512-byte boundary;
* server faults (`nemesis.server`, ``--store postgres`` only): `pg-terminate` (the server ends the
  worker's session), `pg-restart` (the server restarts as after a crash, during a turn and during a
  recovery), `pg-hang` (the worker's backend stops answering until the worker is killed);
* recovery faults (`nemesis.recovery`): `concurrent-resume` (after the first landed kill,
  `CROWD` resume workers start at once on the interrupted turn; checker: consume-once) and
  `twin-recovery` (two byte-identical copies of the crashed state are each resumed by a
  worker of their own and must give the same transcript; checker: recovery-determinism).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

FAULT_KINDS = ("probe", "timer", "pause", "interrupt")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    turn: int = 0
    process: int = 0
    probe: str | None = None
    n: int = 1
    mode: str = "self"
    delay_ms: int = 0
    then: "Fault | None" = None
    aim: int | None = None  # timer only: basis points of the measured live span (delay_ms: resolved)

    @property
    def point(self) -> str | None:
        return f"{self.probe}:{self.n}" if self.probe else None

    def label(self) -> str:
        where = f"t{self.turn}p{self.process}"
        if self.kind == "timer" and self.aim is not None:
            text = f"timer@{self.aim / 100:.2f}%@{where}"
        elif self.kind == "timer":
            text = f"timer@{self.delay_ms}ms@{where}"
        else:
            text = f"{self.kind}:{self.mode}@{self.probe}:{self.n}@{where}"
        return text + (f"+{self.then.label()}" if self.then else "")

    @classmethod
    def parse(cls, label: str) -> "Fault":
        first, plus, rest = label.partition("+")
        then = cls.parse(rest) if plus else None
        try:
            head, point_or_delay, where = first.split("@")
            turn_text, process_text = where[1:].split("p")
            turn, process = int(turn_text), int(process_text)
            if head == "timer" and point_or_delay.endswith("%"):
                aim = round(float(point_or_delay[:-1]) * 100)
                if not 0 < aim <= 10_000:
                    raise ValueError(point_or_delay)
                return cls("timer", turn, process, then=then, aim=aim)
            if head == "timer":
                return cls("timer", turn, process, delay_ms=int(point_or_delay.removesuffix("ms")), then=then)
            kind, mode = head.split(":")
            probe, n = point_or_delay.rsplit(":", 1)
            if kind not in FAULT_KINDS:
                raise ValueError(kind)
            return cls(kind, turn, process, probe=probe, n=int(n), mode=mode, then=then)
        except ValueError:
            raise ValueError(f"{label!r} is not a fault label (e.g. probe:self@flush.committed:2@t0p0)") from None

    @property
    def unaimed(self) -> bool:
        """An aimed timer whose delay is not known yet: it needs its scenario's measured live span."""
        return self.kind == "timer" and self.aim is not None and self.delay_ms <= 0

    def aimed(self, span_ms: int) -> "Fault":
        """This fault with an aimed timer's delay worked out from a live span (anything else: itself)."""
        if self.kind != "timer" or self.aim is None:
            return self
        return replace(self, delay_ms=aimed_delay_ms(self.aim / 10_000, span_ms))

    def exact(self) -> "Fault":
        """What ran, to the millisecond: an aimed timer whose delay is known, labelled by its delay."""
        if self.kind == "timer" and self.aim is not None and self.delay_ms > 0:
            return replace(self, aim=None)
        return self

    def worker_args(self) -> list[str]:
        """Arguments for the targeted worker (timer faults need none: the supervisor fires them)."""
        if self.kind == "timer":
            return []
        mode = self.kind if self.kind in ("pause", "interrupt") else self.mode
        return ["--kill-at", f"{self.probe}:{self.n}", "--kill-mode", mode]


# Timer kills aim at this share of a worker's measured live span: late enough to land past
# its start, early enough that a run a little faster than the measured one is still alive.
TIMER_AIM = (0.02, 0.7)


def aimed_delay_ms(fraction: float, span_ms: int) -> int:
    """A timer kill's delay: `fraction` of the live span a fault-free run of the case measured."""
    return max(1, int(fraction * max(span_ms, 1)))

