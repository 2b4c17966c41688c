"""A family of `--faults` is one class: the `Nemesis` protocol, and the registry that finds them.

A family names the faults it answers (`FAULTS`), when a case plans to meet them (`PLANNED`),
and acts through the hooks of a case's run that it needs; the case runner calls every chosen
family at each hook and knows no fault by name. Each decision (the fault landed, or was
skipped and why) is written down with `case.account(...)` (supervisor.chaos.nemesis.accounting).

Families are found through the entry-point group `hermes_supervisor.faults` (name ->
``module:Class``), so a package adds one with no edit here; this project's own are registered
the same way (pyproject.toml), and `BUILTIN` holds them for a checkout run without being
installed. Their order is the order of the hooks: the storage rounds run before the recovery ones.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from targetkit.registry import plugins
from targetkit.target import load

if TYPE_CHECKING:
    from supervisor.chaos.runner import CaseRunner
    from supervisor.procs.pool import WorkerProcess
    from testkit.pgcluster import PgCluster
    from testkit.script import Script

GROUP = "hermes_supervisor.faults"
EVERY_CASE = "every-case"      # planned in every case (applied at a moment every case may reach)
AFTER_A_KILL = "after-a-kill"  # planned in every case whose plan kills a worker
PER_CAMPAIGN = "per-campaign"  # counted for the whole campaign, from what its model served

BUILTIN = {
    "model": "supervisor.chaos.nemesis.model:ModelFaults",
    "refused": "supervisor.chaos.nemesis.model:RefusedModel",
    "locked": "supervisor.chaos.nemesis.storage:LockedDatabase",
    "storage": "supervisor.chaos.nemesis.storage:BrokenStorage",
    "ending": "supervisor.chaos.nemesis.ending:EndedTurns",
    "twin-recovery": "supervisor.chaos.nemesis.recovery:TwinRecovery",
    "concurrent-resume": "supervisor.chaos.nemesis.recovery:ConcurrentResume",
    "power": "supervisor.chaos.nemesis.powerloss:PowerLoss",
    "server": "supervisor.chaos.nemesis.server:ServerFaults",
}


class FaultUnavailable(Exception):
    """A fault asked for that this machine cannot make, or with one it cannot be combined with (one line)."""


class Nemesis:
    """The faults of one family met by one case. Every hook does nothing unless overridden."""

    FAULTS: ClassVar[tuple[str, ...]] = ()  # the `--faults` names this family answers
    PLANNED: ClassVar[str] = AFTER_A_KILL
    NEVER_REACHED: ClassVar[str] = "the moment it applies at never came"  # a planned fault with no decision
    # The session stores (`--store`) its faults can be made on. A family that says nothing acts on
    # the case's SQLite file (`case.db`), which a campaign on PostgreSQL does not have.
    STORES: ClassVar[tuple[str, ...]] = ("sqlite",)
    WHY_NOT_ON: ClassVar[str] = "it acts on the case's SQLite database file"  # one line: why the others are refused

    def __init__(self, case: CaseRunner, chosen: tuple[str, ...], resource: Any = None) -> None:
        self.case = case          # the case's runner: its files, history, workers and snapshots
        self.chosen = chosen      # the family's faults the campaign asked for
        self.resource = resource  # what `open_resource` gave the campaign, shared by its cases

    # ------------------------------------------------------------ the campaign's
    @classmethod
    def check_available(cls, chosen: tuple[str, ...], faults: tuple[str, ...], workdir: Path) -> None:
        """Raise FaultUnavailable when the faults `chosen` cannot be made here (`faults`: all asked for)."""

    @classmethod
    def check_store(cls, chosen: tuple[str, ...], store: str) -> None:
        """Raise FaultUnavailable when the faults `chosen` cannot be made on the session store `store`."""
        if store not in cls.STORES:
            raise FaultUnavailable(f"--faults {','.join(chosen)} cannot run with --store {store}: {cls.WHY_NOT_ON}")

    @classmethod
    def check_target(cls, chosen: tuple[str, ...], target: str) -> None:
        """Raise FaultUnavailable when the faults `chosen` cannot be made on the target named `target`."""

    @classmethod
    def open_resource(cls, chosen: tuple[str, ...]) -> Any:
        """Something the campaign keeps for every case of this family (closed with `.close()`), or None."""
        return None

    @classmethod
    def model_script(cls, script: Script, chosen: tuple[str, ...]) -> Script:
        """The campaign's scripted model, with what this family makes it do."""
        return script

    # ------------------------------------------------------------ the case's
    def state_dir(self) -> Path | None:
        """Where the case's state lives instead of its directory (None: its directory)."""
        return None

    def server(self) -> PgCluster | None:
        """A PostgreSQL server of the case's own, made in `setup`, for its database instead of the
        campaign's (None: the campaign's). Only asked with ``--store postgres``."""
        return None

    def setup(self) -> None:
        """Before the case's first worker."""

    def teardown(self) -> None:
        """After the case, whatever happened in it."""

    def worker_timeout(self, seconds: float) -> float:
        """The workers' model request timeout."""
        return seconds

    def model_url(self, url: str) -> str:
        """The model endpoint the next worker is given."""
        return url

    def on_effect(self) -> None:
        """A tool's effect is about to happen; its worker waits until this returns."""

    def on_probe(self, proc: WorkerProcess, name: str) -> None:
        """`proc` reached the probe point `name` (reported as it goes on, never waited on)."""

    def on_exit(self, proc: WorkerProcess) -> None:
        """A worker of the case was reaped, whatever ended it; nothing has read the state since."""

    def on_kill(self, killed: WorkerProcess) -> bool:
        """A kill the nemesis planned landed on `killed`; True when this took the case's exit snapshot."""
        return False

    def after_kill(self, turn_index: int, state: str | None) -> str | None:
        """With the killed worker's turn in `state` and no worker running; the turn's state after."""
        return state


def _load(name: str, value: str) -> type[Nemesis]:
    family = load(value)
    if not (isinstance(family, type) and issubclass(family, Nemesis) and family.FAULTS):
        raise TypeError(f"fault family {name!r} ({value}) is not a Nemesis class naming its FAULTS")
    return family


@lru_cache(maxsize=1)
def families() -> tuple[type[Nemesis], ...]:
    """Every family, ours first; each fault name belongs to one."""
    found = tuple(_load(name, value) for name, value in plugins(GROUP, BUILTIN).items())
    owners: dict[str, str] = {}
    for family in found:
        for fault in family.FAULTS:
            if fault in owners:
                raise TypeError(f"the fault {fault!r} belongs to two families: {owners[fault]} and "
                                f"{family.__name__}")
            owners[fault] = family.__name__
    return found


def fault_names() -> tuple[str, ...]:
    """Every name `--faults` takes."""
    return tuple(fault for family in families() for fault in family.FAULTS)


def chosen(faults: tuple[str, ...] | list[str]) -> list[tuple[type[Nemesis], tuple[str, ...]]]:
    """The families `faults` asks for, each with its faults among them, in the families' order."""
    out = []
    for family in families():
        mine = tuple(f for f in faults if f in family.FAULTS)
        if mine:
            out.append((family, mine))
    return out


def check_store(faults: tuple[str, ...] | list[str], store: str, target: str) -> None:
    """Raise FaultUnavailable for the first family of `faults` that cannot act on the store `store`
    or on the target named `target`."""
    for family, mine in chosen(faults):
        family.check_store(mine, store)
        family.check_target(mine, target)


def planned_how(fault: str) -> tuple[str, str]:
    """(PLANNED, NEVER_REACHED) of the family `fault` belongs to."""
    family = next(f for f in families() if fault in f.FAULTS)
    return family.PLANNED, family.NEVER_REACHED
