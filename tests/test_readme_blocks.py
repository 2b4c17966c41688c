"""The README's runnable shell blocks run, as pasted, against this checkout.

A block is runnable when the line before its ```sh fence is ``<!-- test: run -->``. Each one runs
in a temporary directory of its own with ``bash -e -o pipefail`` (a failing command fails the
block, as it would stop a person pasting it), with this checkout's .venv/bin first on PATH (so
``hermes-supervisor`` is this checkout's), loopback only (NO_PROXY), in a session of its own.
Whatever a block leaves running is ended by recorded pid: the block's session, and the daemon of
any database it made (``status --json`` names its pid).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MARK = "<!-- test: run -->"
BLOCK_TIMEOUT_S = 300.0
# The sections whose blocks must be runnable: a block there without the marker fails the test.
RUNNABLE_SECTIONS = ("## Run it as a service", "## Crash-test your agent")


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """(section heading, block body) of every ```sh block marked runnable, in order."""
    blocks, heading = [], ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            heading = line
        if line == MARK:
            assert i + 1 < len(lines) and lines[i + 1] == "```sh", f"{MARK} on line {i + 1} is not before a ```sh block"
            end = lines.index("```", i + 2)
            blocks.append((heading, "\n".join(lines[i + 2:end]) + "\n"))
    return blocks


BLOCKS = runnable_blocks(README.read_text(encoding="utf-8"))


def test_the_sections_that_promise_a_runnable_block_mark_every_block() -> None:
    text = README.read_text(encoding="utf-8")
    marked = {heading for heading, _ in BLOCKS}
    assert set(RUNNABLE_SECTIONS) <= marked, f"no runnable block under {set(RUNNABLE_SECTIONS) - marked}"
    for heading in RUNNABLE_SECTIONS:
        section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
        fences = re.findall(r"(?:^|\n)(.*)\n```sh\n", section)
        assert fences and all(before == MARK for before in fences), f"an unmarked sh block under {heading}"


def test_a_block_is_found_with_its_section() -> None:
    text = f"# t\n\n## One\n\n{MARK}\n```sh\necho one\n```\n\n## Two\n\n```sh\necho not run\n```\n"
    assert runnable_blocks(text) == [("## One", "echo one\n")]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV"))}
    env.update(PATH=os.pathsep.join([str(REPO / ".venv" / "bin"), str(Path(sys.executable).parent),
                                     env.get("PATH", "/usr/bin:/bin")]),
               HOME=str(home), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _daemon_pids(directory: Path, env: dict[str, str]) -> list[int]:
    """The pids the daemons of the databases under `directory` recorded (status --json)."""
    pids = []
    for db in directory.glob("*.db"):
        proc = subprocess.run([str(REPO / ".venv" / "bin" / "hermes-supervisor"), "status", "--db", str(db), "--json"],
                              cwd=directory, env=env, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        try:
            pid = (json.loads(proc.stdout).get("daemon") or {}).get("pid")
        except ValueError:
            continue
        if isinstance(pid, int) and pid > 1:
            pids.append(pid)
    return pids


def _end(pids: list[int], group: int) -> None:
    """SIGTERM the recorded daemons and the block's session, then SIGKILL whatever is left of them."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if _alive(pid):
                os.kill(pid, sig)
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize("heading, block", BLOCKS, ids=[h.removeprefix("## ") for h, _ in BLOCKS])
def test_the_block_runs_as_pasted(heading: str, block: str, tmp_path: Path) -> None:
    assert (REPO / ".venv" / "bin" / "hermes-supervisor").exists(), "no .venv: run ./scripts/setup"
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = _env(home)
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", block], cwd=work, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is the recorded pid
        out, err = proc.communicate()
        pytest.fail(f"{heading}: the block did not finish in {BLOCK_TIMEOUT_S:.0f}s\n{out[-2000:]}\n{err[-3000:]}")
    finally:
        _end(_daemon_pids(work, env), proc.pid)
        if proc.poll() is None:
            proc.wait()
    logs = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(work.glob("*.log")))
    assert proc.returncode == 0, (f"{heading}: the block exited {proc.returncode}\n--- stdout\n{out[-3000:]}\n"
                                  f"--- stderr\n{err[-3000:]}{logs}")
