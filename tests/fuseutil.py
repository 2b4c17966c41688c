"""What every test that needs the lazy file system does first: run, skip with the reason, or,
in CI (CI=true), fail, since there a machine without FUSE is a broken machine."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.chaos.nemesis.lazyfs import LazyFS, why_unavailable


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_fuse() -> None:
    why = why_unavailable()
    if why is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and the lazy file system cannot run here: {why}", pytrace=False)
    pytest.skip(f"the lazy file system cannot run here: {why}")


def lazy_mount(root: Path) -> tuple[Path, Path, LazyFS]:
    """(backing, mount point, the lazy file system mounted over it), in two new directories of `root`."""
    backing, mnt = root / "backing", root / "mnt"
    backing.mkdir()
    mnt.mkdir()
    return backing, mnt, LazyFS(backing, mnt).start()
