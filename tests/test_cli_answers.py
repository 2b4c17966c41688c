"""What a person sees from the commands when something is out of reach or wrong: one line, a
documented exit status, never a traceback, never a password; and `check`'s one-line verdict."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.state import SessionDB

from daemon_helpers.harness import REPO, env_for  # isort: skip



@pytest.fixture(autouse=True)
def _postgres_extra() -> None:
    """Asked per test, not at import: a run that selects none of these (the upstream environment's,
    which has no psycopg) must not report a skip for them."""
    pytest.importorskip("psycopg", reason="a --store URL needs the postgres extra")


PASSWORD = "hunter22-secret"


def supervisor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=tmp_path, env=env_for(tmp_path),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _verbs(url: str, home: Path) -> dict[str, list[str]]:
    return {"submit": ["submit", "--store", url, "--session", "s", "hello"],
            "status": ["status", "--store", url],
            "result": ["result", "--store", url, "t-1"],
            "check": ["check", "--store", url],
            "serve": ["serve", "--store", url, "--home", str(home)]}


@pytest.mark.parametrize("password", [PASSWORD, "hunter%zz22"])
def test_every_verb_says_an_unreachable_store_in_one_line_and_exits_2(tmp_path: Path, password: str) -> None:
    """No server listens in `tmp_path` (a Unix socket directory with none in it): every verb fails the
    same way, and `serve` has created nothing. A malformed password is refused before libpq, which
    would quote it."""
    url = f"postgresql://someone:{password}@/hermes?host={tmp_path}"
    home = tmp_path / "home-of-serve"
    for verb, argv in _verbs(url, home).items():
        done = supervisor(tmp_path, *argv)
        assert done.returncode == 2, (verb, done.returncode, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("hermes-supervisor: error: "), (verb, done.stderr)
        assert "Traceback" not in done.stderr and done.stdout == "", (verb, done.stdout)
        assert password not in done.stderr and "hunter" not in done.stderr, (verb, done.stderr)
    assert not home.exists()


def test_status_without_a_live_daemon_exits_3_and_still_shows_the_store(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    SessionDB(db).close()
    shown = supervisor(tmp_path, "status", "--db", str(db))
    assert shown.returncode == 3 and "daemon: not running" in shown.stdout, shown
    as_json = supervisor(tmp_path, "status", "--db", str(db), "--json")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["daemon"]["state"] == "not running"


def test_check_says_its_verdict_in_one_line_and_all_of_it_with_json(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    with SessionDB(db) as handle:
        handle.create_session("s")
        handle.write_pending("s", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    line = supervisor(tmp_path, "check", "--db", str(db))
    assert line.returncode == 0 and line.stdout.count("\n") == 1, line
    assert line.stdout.startswith(f"{db}: valid (well-formed, no-duplicate-rows, answer-once)"), line.stdout
    whole = supervisor(tmp_path, "check", "--db", str(db), "--json")
    assert whole.returncode == 0 and json.loads(whole.stdout)["valid"] is True
    missing = supervisor(tmp_path, "check", "--db", str(db), "--session", "nobody")
    assert missing.returncode == 1 and missing.stdout.count("\n") == 1 and "unknown" in missing.stdout
    # A directory is a wrong argument (exit 2, one line), not a damaged database (exit 1).
    folder = supervisor(tmp_path, "check", "--db", str(tmp_path))
    assert folder.returncode == 2 and folder.stdout == "", folder
    assert folder.stderr == f"hermes-supervisor: error: --db {tmp_path} is a directory, not a database file\n"


def test_check_counts_its_violations_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.check_command import print_verdict

    one = {"valid": False, "violations": [{"invariant": "answer-once"}]}
    assert print_verdict(one, "db", as_json=False) == 1
    two = {"valid": False, "violations": [{"invariant": "answer-once"}, {"invariant": "well-formed"}]}
    print_verdict(two, "db", as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("db: NOT valid: 1 violation of answer-once (")
    assert lines[1].startswith("db: NOT valid: 2 violations of answer-once, well-formed (")


def test_no_message_offers_an_install_line_that_cannot_work() -> None:
    """The package is on no index: `pip install 'hermes-supervisor[EXTRA]'` fails wherever it is
    printed."""
    elsewhere = {Path("hermes/extras.py")}  # it says why the line cannot work
    found = [str(path.relative_to(REPO)) for package in ("hermes", "supervisor", "worker", "targetkit", "bench")
             for path in sorted((REPO / package).rglob("*.py"))
             if path.relative_to(REPO) not in elsewhere
             and "pip install 'hermes-supervisor[" in path.read_text(encoding="utf-8")]
    assert found == []


def test_the_install_line_of_a_checkout_is_its_setup_script() -> None:
    from hermes.extras import install_line, requirements

    code = "from hermes.extras import install_line; print(install_line('postgres'))"
    elsewhere = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60,
                               env={"PYTHONPATH": str(REPO)}).stdout.strip()
    assert elsewhere == f"{REPO / 'scripts' / 'setup'} postgres"
    if Path(sys.prefix).resolve().parent == REPO.resolve():  # this interpreter is one scripts/setup made
        assert install_line("http") == "./scripts/setup http" or install_line("http").endswith("scripts/setup http")
    assert any(req.startswith("psycopg") for req in requirements("postgres"))


def test_an_output_directory_that_cannot_be_made_is_said_up_front_in_one_line(tmp_path: Path) -> None:
    """--report, --regression-out and merge's OUT_DIR under a regular file: refused before any case
    runs (chaos) or in one line after the shards were read (merge), never in a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for flag in ("--report", "--regression-out"):
        done = supervisor(tmp_path, "chaos", "--scenario", "single-tool", "--limit", "1", flag, str(blocker / "out"))
        assert done.returncode == 2, (flag, done.returncode, done.stderr)
        assert done.stderr == f"hermes-supervisor: error: {flag} {blocker / 'out'}: cannot make this directory " \
                              "(Not a directory)\n", done.stderr
        assert done.stdout == "", done.stdout  # no case ran
    shard = tmp_path / "shard"
    assert supervisor(tmp_path, "chaos", "--scenario", "single-tool", "--limit", "1", "--report", str(shard)).returncode == 0
    done = supervisor(tmp_path, "merge", str(blocker / "merged"), str(shard))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, (done.returncode, done.stderr)
    assert done.stderr.startswith(f"hermes-supervisor: error: OUT_DIR {blocker / 'merged'}: cannot write"), done.stderr
