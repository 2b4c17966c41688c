"""CI's fixed sample of a long sweep.

A sweep over every kill point, every planted bug or every scenario costs minutes on two cores.
CI runs a fixed part of it, chosen to cover each kind of case the sweep holds; the rest is
marked `nightly`, which `scripts/test` leaves out unless given `--nightly` (the nightly workflow
runs it). A plain `pytest` runs everything.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

NIGHTLY = pytest.mark.nightly


def sample(values: Iterable[Any], ci: Sequence[Any], *, ids: Any = None) -> list[Any]:
    """`values` as pytest parameters, those not in `ci` marked `nightly`. A value of `ci` that is
    not among `values` is an error: a sample must not quietly shrink when the sweep changes."""
    values = list(values)
    missing = [v for v in ci if v not in values]
    if missing:
        raise ValueError(f"the CI sample names values the sweep does not have: {missing}")
    params = []
    for value in values:
        marks = () if value in ci else (NIGHTLY,)
        args = value if isinstance(value, tuple) else (value,)
        label = ids(value) if callable(ids) else None
        params.append(pytest.param(*args, marks=marks, id=label))
    return params
