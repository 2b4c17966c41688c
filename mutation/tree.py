"""Private copies of the project tree, and the digests that say what must run again.

The copy is of the working tree's files that git knows or would know (tracked, plus untracked
files that are not ignored): uncommitted edits are the code under test. Bytecode is never
copied, so a mutant can only be read from its source.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

# The durability core: every module a mutant is made in. Both store engines are in it.
CORE_DIRS = ("hermes/store",)
CORE_FILES = (
    "hermes/turn.py", "hermes/executor.py", "hermes/resume.py", "hermes/finalizer.py",
    "hermes/compaction.py", "hermes/outcomes.py", "hermes/private_files.py", "worker/ledger.py",
)
# What the oracle is made of besides the module under mutation: a change here can change a
# verdict, so every module's results are run again.
ORACLE_DIRS = ("supervisor", "worker", "testkit", "targetkit", "mutation")


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]


def listed_files(root: Path) -> list[str]:
    """The files of `root`'s working tree that git tracks or would track, existing ones only (every
    file, when `root` is a copy outside git: a frozen tree to measure)."""
    if (root / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, check=True, capture_output=True).stdout
        names = sorted({n for n in out.decode().split("\0") if n})
    else:
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return [n for n in names if (root / n).is_file() and "__pycache__" not in n and not n.endswith(".pyc")]


def core_modules(root: Path) -> list[str]:
    """The core's module paths, relative to `root`, in a fixed order."""
    found = [str(p.relative_to(root)) for d in CORE_DIRS for p in sorted((root / d).rglob("*.py"))]
    return sorted(set(found) | {f for f in CORE_FILES if (root / f).is_file()})


def copy_tree(src: Path, dst: Path, files: list[str] | None = None) -> Path:
    """Copy `src`'s listed files into `dst` (replaced if it exists)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in files if files is not None else listed_files(src):
        target = dst / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, target)
    return dst


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def digest_of(root: Path, names: list[str]) -> str:
    """One digest of the named files' paths and contents."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


# Of this package, what judges a mutant (running, merging and rendering the score do not).
ORACLE_OWN = ("mutation/oracle.py", "mutation/launch.py", "mutation/casemap.py", "mutation/tree.py")


def oracle_version(root: Path, files: list[str]) -> str:
    """The oracle's version: the harness, the worker, the test kits and this package's judging part."""
    return digest_of(root, [f for f in files if f.endswith(".py") and f.split("/", 1)[0] in ORACLE_DIRS
                            and (not f.startswith("mutation/") or f in ORACLE_OWN)])


# What decides which lines each case runs: the runtime, the worker, and the scenarios and kill
# points the cases are derived from, and how the map measures them. The rest of the harness
# judges, it does not steer (what the checker reads of the core is the runtime's code).
MAP_INPUTS = ("hermes/", "worker/", "supervisor/chaos/scenarios.py", "supervisor/chaos/generator.py",
              "testkit/modelserver", "mutation/casemap.py", "mutation/launch.py")


def code_version(root: Path, files: list[str]) -> str:
    """The version of the code a case map was built from."""
    return digest_of(root, [f for f in files if f.endswith(".py") and f.startswith(MAP_INPUTS)])

