"""docs/fleet.md's walkthrough, run as pasted against a private cluster: it answers, and it leaves
nothing where it was run (its daemons' homes and their ledger live in a temporary directory it
removes)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pgfixtures import pg_cluster, pg_url  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parent.parent
FLEET = REPO / "docs" / "fleet.md"


def walkthrough() -> str:
    """The shell block of the walkthrough: the one that starts daemons of a fleet."""
    blocks = re.findall(r"```sh\n(.*?)```", FLEET.read_text(encoding="utf-8"), re.S)
    return next(block for block in blocks if "--home fleet-a" in block and "serve --store" in block)


@pytest.mark.xdist_group("chaos")
def test_the_walkthrough_answers_and_leaves_nothing_behind(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    checkout, scratch = tmp_path / "checkout", tmp_path / "tmp"
    checkout.mkdir()
    scratch.mkdir()
    env = {**os.environ, "URL": pg_url, "TMPDIR": str(scratch), "NO_PROXY": "127.0.0.1,localhost",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "HERMES_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(["bash", "-c", walkthrough()], cwd=checkout, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None or proc.returncode != 0:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the block's daemons, if it stopped before killing them
            except ProcessLookupError:
                pass
            proc.wait(30)
    assert proc.returncode == 0, err[-3000:]
    assert "You said: hello again" in out, out
    assert re.search(r"^postgresql://\S+: valid \(", out, re.M), out
    assert list(checkout.iterdir()) == [] and list(scratch.iterdir()) == []
