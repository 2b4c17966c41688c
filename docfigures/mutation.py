"""docs/chaos.md's mutation score: the stored figure, with the reviewed triage's words.

    python scripts/figures.py store mutation DIR_OR_FILE ...   merge shard results into the figure
        (`scripts/mutation merge`; the shards come from `scripts/mutation run`, the nightly
        workflow's matrix), then render the pages

The figure keeps what a run measured; each survivor's and equivalent's reason is rendered as
mutation/triage.toml words it now (mutation.score.retriaged), so a reason sharpened since the run
shows without running it again.
"""
from __future__ import annotations

from mutation import score

from docfigures.common import FIGURES, REPO, read_json

STORE = FIGURES / "mutation.json"
TRIAGE = REPO / "mutation" / "triage.toml"


def store(args: list[str]) -> None:
    from mutation.__main__ import main

    if main(["merge", *args, "--out", str(STORE)]) != 0:
        raise SystemExit("figures: the mutation merge failed")


def figure() -> dict:
    return score.retriaged(read_json(STORE), score.load_triage(TRIAGE))


def block() -> str:
    return score.render(figure())
