"""The declared blocks in their pages, through cog: render every page, or say which blocks drifted.

cog (`cogapp`) finds each `[[[cog ...]]]` block of a page, runs its line and puts what it writes
before the block's `[[[end]]]`; the same run over today's page says whether it would change.
A check names each block that differs, not only the page, so it compares block by block.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from cogapp import Cog

from docfigures import BLOCKS
from docfigures.common import REPO

PROLOGUE = "from docfigures import figure"
BLOCK = re.compile(r'^<!-- \[\[\[cog figure\("(?P<name>[^"]+)"\)\]\]\] -->\n(?P<text>.*?)^<!-- \[\[\[end\]\]\] -->$',
                   re.S | re.M)


def pages() -> list[str]:
    return list(dict.fromkeys(page for block in BLOCKS.values() for page in block.pages))


def blocks_of(text: str) -> dict[str, str]:
    return {m.group("name"): m.group("text") for m in BLOCK.finditer(text)}


def cogged(page: str, text: str) -> str:
    """`text`, the text of `page`, with every block rendered from its stores."""
    cog = Cog()
    cog.options.prologue = PROLOGUE
    return cog.process_string(text, fname=page)


def missing(page: str, text: str) -> list[str]:
    """Blocks declared for `page` that it does not hold, and blocks it holds that nothing declares."""
    held = set(blocks_of(text))
    wanted = {name for name, block in BLOCKS.items() if page in block.pages}
    return sorted(f"{name} (not in {page})" for name in wanted - held) + \
        sorted(f"{name} (in {page}, not declared)" for name in held - wanted)


def drifted(only: Iterable[str] | None = None) -> list[str]:
    """'NAME in PAGE' for every block whose page text is not what its stores render."""
    found = []
    for page in pages():
        text = (REPO / page).read_text(encoding="utf-8")
        found += missing(page, text)
        now, then = blocks_of(text), blocks_of(cogged(page, text))
        found += [f"{name} in {page}" for name in now if now[name] != then.get(name)
                  and (only is None or name in only)]
    return found


def render() -> list[str]:
    """Write every page whose blocks differ from their stores (each page read just before it is
    written: a long measurement must not lose an edit made meanwhile); the pages written."""
    written = []
    for page in pages():
        path = REPO / page
        text = path.read_text(encoding="utf-8")
        absent = missing(page, text)
        if absent:
            raise SystemExit(f"figures: {'; '.join(absent)}")
        new = cogged(page, text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            written.append(page)
    return written
