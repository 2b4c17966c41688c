"""A campaign's settings: what it runs (scenarios, mode, seed, shard, which faults), against which
target and with which of its options, and how (jobs, restarts, timeouts, where its files go).

Its own module, so the modules a campaign is built of (generator, plan, runner) can name it
without importing the campaign.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from targetkit import registry


@dataclass
class CampaignConfig:
    scenarios: list[str]
    mode: str = "exhaustive"
    seed: int = 0
    runs: int = 50
    jobs: int = 2
    shard: tuple[int, int] = (1, 1)
    kill_modes: tuple[str, ...] = ("self",)
    workdir: Path | None = None
    keep: bool = False
    max_restarts: int = 8
    process_timeout: float = 60.0
    limit: int | None = None
    case_ids: tuple[str, ...] = ()
    forkserver: bool = True
    faults: tuple[str, ...] = ()  # extra nemesis faults on every case: see nemesis.family
    case_files: Path | None = None  # when set, each case's result and history is written here as JSON
    probes: tuple[str, ...] = ()  # only derive cases whose first fault is at one of these probes
    target: str = registry.DEFAULT  # the system under test: a name targetkit.registry knows
    # Options of the target's own, checked by it (e.g. (("durability", "async"),)): given to every
    # worker as `--target-option KEY=VALUE`, and written so in each case's repro line.
    target_options: tuple[tuple[str, str], ...] = ()
    synchronous: str = "FULL"  # every worker's session database: FULL or NORMAL (`--synchronous`)
    # How the scripted model names tool calls (`--call-ids`): "fresh" ids, or "numbered" per
    # response (`<tool>:<position>`, as some providers do), which repeat across a turn's rounds.
    call_ids: str = "fresh"
    # Where the workers keep their sessions: "sqlite" (a file per case) or "postgres" (a database per
    # case on the campaign's private server, supervisor.chaos.pgstore); `--store`.
    store: str = "sqlite"
    # A user's own tools module (`--tools`, supervisor.chaos.own_tools): every worker runs its tools
    # through the effects ledger, and the conversations call them. None: the chaos tools.
    tools: str | None = None
