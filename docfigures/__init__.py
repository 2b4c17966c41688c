"""Every generated block of README.md and docs/, declared once, and every measurement they read.

A measurement is a store under docs/figures/ and the command that measures it
(`python scripts/figures.py store NAME`; the store of `findings` is written by hand). A block is
a name, the pages it is rendered into, the measurements it reads and its render function, a
function of the stores alone: rendering runs nothing, and a check is exact (timings included:
they are stored values, not fresh ones).

In a page a block is cog's: `<!-- [[[cog figure("NAME")]]] -->`, the rendered text, then
`<!-- [[[end]]] -->`; `scripts/figures.py` runs cog over the pages (docfigures.pages).

"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docfigures import bench, campaigns, findings, minimal, mutation, proof, readme, targets, upstream


@dataclass(frozen=True)
class Measurement:
    name: str
    store: Path
    runs: str                                    # what it runs, in a word or a command line
    measure: Callable[[list[str]], None] | None  # run it and store it (None: the store is written by hand)


@dataclass(frozen=True)
class Block:
    name: str
    pages: tuple[str, ...]        # where it is rendered, from the repository root
    reads: tuple[str, ...]        # the measurements it is rendered from
    render: Callable[[str], str]  # the block for the page it goes into


MEASUREMENTS = {m.name: m for m in (
    Measurement("quick", campaigns.QUICK_STORE, "hermes-supervisor " + " ".join(campaigns.QUICK_ARGS),
                campaigns.store_quick),
    Measurement("demo", readme.DEMO_STORE, "hermes-supervisor " + " ".join(readme.DEMO_ARGS), readme.store_demo),
    Measurement("powerloss", readme.POWER_STORE, "the power-cut campaigns (FULL, NORMAL, torn-write) and their bench",
                readme.store_powerloss),
    Measurement("bench", bench.BENCH_STORE, bench.BENCH_COMMAND, bench.store_bench),
    Measurement("memory", bench.MEMORY_STORE, bench.MEMORY_COMMAND, bench.store_memory),
    Measurement("proof", proof.STORE, "its shards (`store proof run DIR`), then their merge (`store proof DIR`)",
                proof.store),
    Measurement("upstream", upstream.UPSTREAM_STORE, "four modes against both targets", upstream.store),
    Measurement("targets", targets.STORE, "one campaign against every target", targets.store),
    Measurement("findings", findings.STORE, "nothing: each entry is written by hand, with its script", None),
    Measurement("minimal", minimal.STORE, "a shrinking campaign against upstream hermes-agent", minimal.store),
    Measurement("mutation", mutation.STORE, "scripts/mutation run (in shards), then their merge", mutation.store),
)}


def _same(render: Callable[[], str]) -> Callable[[str], str]:
    return lambda page: render()


BLOCKS = {b.name: b for b in (
    Block("demo", ("README.md",), ("demo",), _same(readme.demo)),
    Block("powerloss", ("README.md",), ("powerloss", "bench"), _same(readme.powerloss)),
    Block("figures", ("docs/performance.md",), ("quick", "bench"), _same(campaigns.quick)),
    Block("performance", ("docs/performance.md",), ("bench", "memory", "upstream"), _same(bench.performance)),
    Block("memory", ("docs/performance.md",), ("memory",), _same(bench.memory)),
    Block("proof", ("docs/scale.md",), ("proof",), _same(proof.block)),
    Block("upstream", ("docs/targets.md",), ("upstream",), _same(upstream.block)),
    Block("targets", ("docs/targets.md",), ("targets",), _same(targets.block)),
    Block("findings", ("README.md", "docs/targets.md"), ("findings",), findings.block),
    Block("minimal", ("README.md",), ("minimal",), _same(minimal.block)),
    Block("mutation", ("docs/chaos.md",), ("mutation",), _same(mutation.block)),
)}


def figure(name: str) -> None:
    """What a page's cog block calls: write the named block for the page cog is rendering."""
    import cog  # only while cog runs a page: its module knows the page

    cog.out(BLOCKS[name].render(cog.inFile) + "\n")
