"""The one line that installs an extra (`http`, `postgres`, `langgraph`, ...), as it works where it
is printed. The package is on no index, so `pip install 'hermes-supervisor[EXTRA]'` cannot work:
run from a checkout's own environment, the line is the checkout's `scripts/setup EXTRA`; anywhere
else, it is pip installing the extra's own requirements (as this installation records them) into
the interpreter that is running."""
from __future__ import annotations

import os
import re
import shlex
import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "hermes-supervisor"
CHECKOUT = Path(__file__).resolve().parent.parent
# The environments scripts/setup makes, and the extras it puts in each (upstream has one of its own).
SETUP_ENVIRONMENTS = (".venv", ".venv-upstream")


def _setup_script() -> Path | None:
    """The checkout's scripts/setup, when this interpreter is one of the environments it makes."""
    script = CHECKOUT / "scripts" / "setup"
    if not script.is_file() or not (CHECKOUT / "pyproject.toml").is_file():
        return None
    prefix = Path(sys.prefix).resolve()
    return script if any(prefix == (CHECKOUT / env).resolve() for env in SETUP_ENVIRONMENTS) else None


def _shown(path: Path) -> str:
    """`path` as a shell runs it from the current directory: `./scripts/setup` at the checkout's root, else absolute."""
    try:
        here = Path.cwd().resolve()
    except OSError:
        here = None
    if here == CHECKOUT:
        return shlex.quote(f"./{path.relative_to(CHECKOUT)}")
    return shlex.quote(str(path))


def requirements(extra: str) -> list[str]:
    """The requirements the installed distribution lists for `extra` (empty when it records none)."""
    try:
        listed = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""")
    return [req.partition(";")[0].strip() for req in listed if marker.search(req.partition(";")[2])]


def install_line(extra: str) -> str:
    """The command that installs `extra` for the interpreter running now."""
    script = _setup_script()
    if script is not None:
        return f"{_shown(script)} {extra}"
    wanted = requirements(extra)
    if not wanted:
        return f"install the `{extra}` extra of {DISTRIBUTION} (its pyproject.toml lists what it needs)"
    python = shlex.quote(sys.executable) if os.path.isabs(sys.executable) else "python"
    return f"{python} -m pip install {' '.join(shlex.quote(req) for req in wanted)}"
