"""cosmic-ray's mutants of the core, named so that a name survives edits elsewhere in the file.

A mutant's id is its module, its operator, a digest of the text of the line it mutates, and
its rank among the mutants of that operator on lines of that same text: a raw line number
would shift with every edit above it. cosmic-ray applies a mutant by (operator, occurrence),
which does shift, so occurrences are recomputed from the current file each run.
"""
from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    module: str
    operator: str
    occurrence: int      # cosmic-ray's index of this operator's mutation in the module, as of now
    line: int            # 1-based, as of now; for people, never for identity
    line_text: str
    rank: int            # among this module's mutants of this operator on lines of this text
    col: int = 0         # where on its line, as of now

    @property
    def id(self) -> str:
        text = hashlib.sha256(self.line_text.encode()).hexdigest()[:10]
        return f"{self.module}:{self.operator}:{text}:{self.rank}"


def enumerate_module(root: Path, module: str) -> list[Mutant]:
    """Every mutant cosmic-ray's default operators make in `module` (relative to `root`)."""
    from cosmic_ray.commands.init import _all_work_items

    lines = (root / module).read_text().splitlines()
    found: list[Mutant] = []
    seen: dict[tuple[str, str], int] = {}
    for item in _all_work_items([root / module], {}):
        for spec in item.mutations:
            number = spec.start_pos[0]
            text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
            key = (spec.operator_name, text)
            rank = seen.get(key, 0)
            seen[key] = rank + 1
            found.append(Mutant(module, spec.operator_name, spec.occurrence, number, text, rank, spec.start_pos[1]))
    return found


def shard_of(mutant_id: str, count: int) -> int:
    """The shard (1..count) a mutant belongs to: a stable hash of its id, so shards never overlap
    and every mutant is in exactly one."""
    return int(hashlib.sha256(mutant_id.encode()).hexdigest()[:12], 16) % count + 1


def in_shard(mutant_id: str, shard: tuple[int, int]) -> bool:
    index, count = shard
    return shard_of(mutant_id, count) == index


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N); anything else raises argparse.ArgumentTypeError, whose message argparse prints."""
    index, _, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = 0, 0
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"shard {text!r}: want I/N with 1 <= I <= N, e.g. 3/8")
    return i, n


def in_annotation(source: str, line: int, col: int) -> bool:
    """Whether (line, col) lies inside a type annotation of a module that never evaluates them
    (`from __future__ import annotations`): a mutant there changes a string nobody reads."""
    import ast

    tree = ast.parse(source)
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
               any(a.name == "annotations" for a in n.names) for n in tree.body):
        return False
    for node in ast.walk(tree):
        spans = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            spans.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            spans.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            spans.append(node.annotation)
        for a in spans:
            start, end = (a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)
            if start <= (line, col) < end:
                return True
    return False
