"""private-files: the case's directory, listed at its end, holds only 0600 files and 0700 directories.

The listing is made from a real directory (`list_modes`), and judged against the target's promise:
ours promises private files (`FULL_PROMISES`), a target that does not is not judged.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes.private_files import create_private_file, make_private_dirs
from supervisor.chaos.checker import FULL_PROMISES, PRIVATE_FILES, private_files
from supervisor.chaos.checker.files import DIRECTORY, FILE, OTHER, list_modes
from targetkit import Promises


def _runtime_dir(root: Path) -> Path:
    """What a case of ours leaves: a database, its WAL, a spilled result under the agent's home."""
    make_private_dirs(root / "hermes-home" / "tool_results" / "s1")
    for name in ("state.db", "state.db-wal", "effects.db", "hermes-home/tool_results/s1/call_1.txt"):
        create_private_file(root / name)
    return root


def _files(root: Path) -> list[dict[str, object]]:
    return [{"type": "files", "entries": list_modes(root)}]


def test_a_private_directory_passes_and_is_counted(tmp_path: Path) -> None:
    verdict = private_files(_files(_runtime_dir(tmp_path)), FULL_PROMISES)
    assert verdict.valid is True
    assert verdict.counts == {"files": 7, "loose": 0}


@pytest.mark.parametrize("name, mode", [("state.db-wal", 0o644), ("state.db", 0o640), ("effects.db", 0o601),
                                        ("hermes-home/tool_results/s1/call_1.txt", 0o400),
                                        ("hermes-home", 0o755), ("hermes-home/tool_results", 0o711)])
def test_one_loose_file_or_directory_fails_and_is_named(tmp_path: Path, name: str, mode: int) -> None:
    root = _runtime_dir(tmp_path)
    os.chmod(root / name, mode)
    verdict = private_files(_files(root), FULL_PROMISES)
    assert verdict.valid is False
    [violation] = verdict.violations
    assert violation.invariant == PRIVATE_FILES
    assert f"{name} {mode:04o}" in violation.message
    kind = DIRECTORY if (root / name).is_dir() else FILE
    assert violation.witness["loose"] == [{"path": name, "kind": kind, "mode": f"{mode:04o}"}]
    os.chmod(root / name, 0o700)  # let pytest remove it


def test_a_target_that_does_not_promise_private_files_is_not_judged(tmp_path: Path) -> None:
    root = _runtime_dir(tmp_path)
    os.chmod(root / "state.db", 0o644)
    assert private_files(_files(root), Promises()).valid is True
    assert private_files(_files(root), FULL_PROMISES).valid is False


def test_links_are_listed_but_not_judged_and_never_followed(tmp_path: Path) -> None:
    root = _runtime_dir(tmp_path / "case")
    outside = tmp_path / "elsewhere"
    outside.mkdir(mode=0o755)
    (outside / "open.txt").write_text("x")
    os.chmod(outside / "open.txt", 0o644)
    (root / "link").symlink_to(outside, target_is_directory=True)
    entries = list_modes(root)
    assert ["link", OTHER, 0o777] in entries
    assert not any(path.startswith("link/") for path, _kind, _mode in entries)
    assert private_files([{"type": "files", "entries": entries}], FULL_PROMISES).valid is True
