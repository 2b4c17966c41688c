"""bench.floor, bench.peers, bench.profile and one recovery cycle, in-process on small sizes. Nothing here is about speed:
only that each measurement runs, cleans up after itself and says what it measured."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bench import campaign, floor, peers, profile, recovery
from bench.table import Report, render
from supervisor.procs.pool import Pool


def test_floor_measures_every_step_and_reaps_its_children(tmp_path: Path) -> None:
    measured = floor.measure_floor(tmp_path, 3, jobs=2)
    for value in (measured.fork_ms, measured.commit_ms, measured.http_kept_ms, measured.http_new_ms,
                  measured.template_fork_ms, measured.template_rate):
        assert value > 0
    assert measured.recovery_ms() > measured.template_fork_ms
    report = Report()
    floor.report_floor(report, measured, "test", 3)
    text = render(report)
    assert "floor (test): fsynced commit (WAL, synchronous=FULL)" in text
    assert "floor (test): warm-template fork cycles/s, jobs=2" in text
    assert list(tmp_path.iterdir()) == []  # its databases are gone


def test_peers_run_one_turn_each_durably_and_not(tmp_path: Path) -> None:
    report = Report()
    peers.bench_peers(report, tmp_path, calls=2, rounds=1)
    names = [f.name for f in report.figures]
    assert any(n.startswith("peers: ours (") for n in names), names
    for f in report.figures:
        if f.value is None:  # a peer that is not installed says so
            assert "not installed" in f.note, f
            continue
        assert "did not end with the scripted answer" not in f.note, f
    ours = next(f for f in report.figures if f.name.startswith("peers: ours ("))
    assert ours.data["commits_per_call"] >= 3  # the request, the intent and the result, at least


def test_collapsed_stacks_summary(tmp_path: Path) -> None:
    (tmp_path / "supervisor.txt").write_text(
        "process 1:\"python\";thread (0x1);main (bench/cli.py:10);spawn (supervisor/procs/pool.py:20) 7\n"
        "process 1:\"python\";thread (0x2);main (bench/cli.py:10) 3\n", encoding="utf-8")
    text = profile._collapsed_summary(tmp_path / "supervisor.txt", "supervisor")
    assert "10 samples" in text and "spawn (pool.py)" in text and "main (cli.py)" in text
    assert "no samples" in profile._collapsed_summary(tmp_path / "template.txt", "template")


@pytest.mark.skipif(profile.unavailable() is not None, reason="pyinstrument or py-spy is not installed")
def test_a_forked_worker_profiles_itself_when_asked(tmp_path: Path) -> None:
    profiling = profile.Profiling(tmp_path / "prof")
    pool = Pool(forkserver=True, env=profiling.env(), cwd=tmp_path)
    try:
        # No command: the worker fails its argument parsing at once and exits 2, profiled.
        proc = pool.spawn([], incarnation=1, on_message=lambda p, m: None)
        assert proc.wait(60)
        assert proc.returncode == 2
    finally:
        pool.close()
    from worker import forkserver

    assert forkserver.PROFILE_ENV == profile.PROFILE_ENV  # the one name both sides read
    saved = list(profiling.workers.glob("worker-*.pyisession"))
    assert len(saved) == 1, saved
    assert "resumed workers combined" in profile._worker_summary(profiling.workers, tmp_path / "tree.txt")


def test_one_recovery_cycle_resumes_and_its_worker_ends_by_itself(tmp_path: Path) -> None:
    """The bench's supervisor answers every report a worker waits on (a final answer included):
    the resumed worker finishes on its own instead of waiting out the bench's timeout."""
    samples = recovery.measure_recovery(True, runs=1, bench_dir=tmp_path, warmup=0)
    assert len(samples) == 1 and samples[0].resumed_ok, samples
    assert {"reaped", "spawned", "hello", "arrived"} <= set(samples[0].marks_ms), samples[0].marks_ms
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(profile.unavailable(samplers=False) is not None, reason="pyinstrument is not installed")
def test_a_missed_goal_names_its_stage_and_the_profile_line_that_holds_it(tmp_path: Path) -> None:
    profiling = profile.Profiling(tmp_path / "prof", samplers=False)
    noop = campaign.measure_noop_cycles(1, 3, tmp_path, profile=profiling)
    # What each worker cost, read from its rusage when it was reaped (this process is its parent).
    assert noop.rate > 0 and noop.user_ms > 0 and noop.system_ms > 0 and noop.minor_faults > 0, noop
    held = profile.held_by(profiling.workers, campaign.NOOP_CODE)
    assert held is not None and held.profiled == 4  # the three cycles and the one before them
    entries = {f"{function} ({file}" for function, file in campaign.NOOP_CODE}
    assert any(held.entry.startswith(e) for e in entries), held
    assert 0 < held.line_ms <= held.entry_ms and not held.line.startswith("["), held
    assert profile.held_by(profiling.workers, [("no_such_function", "nowhere.py")]) is None
    # Recovery: the stage furthest above its floor step; a supervisor's stage has no worker profile line.
    stages = [("kill -> reaped", 9.0), ("running -> resume begins (open, lease)", 3.0)]
    floors = {"kill -> reaped": (1.0, "bare fork"), "running -> resume begins (open, lease)": (0.2, "one commit")}
    said = recovery._what_holds_it(stages, floors, 12.0, tmp_path, None)
    assert said.startswith("held by the stage kill -> reaped (9.0 of the 12.0 ms") and "not of the worker" in said


class _Step:
    def work(self, n: int) -> int:
        return sum(i * i for i in range(n))


@pytest.mark.skipif(profile.unavailable(samplers=False) is not None, reason="pyinstrument is not installed")
def test_each_timed_call_can_profile_itself_in_the_thread_that_makes_it(tmp_path: Path) -> None:
    original, seconds = _Step.work, []
    with profile.timed_calls(_Step, "work", seconds, tmp_path, "step"):
        threads = [threading.Thread(target=_Step().work, args=(200_000,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _Step().work(10)
    assert _Step.work is original and len(seconds) == 4 and all(s > 0 for s in seconds)
    held = profile.held_by(tmp_path, [("work", "test_bench_floor.py")], unit="step")
    assert held is not None and held.profiled == 4 and "over 4 profiled steps" in held.describe(), held
    assert profile.held_by(tmp_path, [("work", "test_bench_floor.py")]) is None  # no worker's profile here


@pytest.mark.skipif(profile.unavailable(samplers=False) is not None, reason="pyinstrument is not installed")
def test_a_missed_campaign_goal_names_the_part_of_a_case_and_the_line_that_holds_it(tmp_path: Path) -> None:
    said = campaign._what_holds_a_case({"workers": 40.0, "supervisor": 12.0}, lambda: "LINE")
    assert said == "held by the workers: 40.0 of 52.0 ms of CPU per warm case; LINE"
    other = campaign._what_holds_a_case({"workers": 1.0, "checker": 5.0}, lambda: pytest.fail("profiled"))
    assert other.startswith("held by the checker: 5.0 of 6.0 ms") and "not a worker's code" in other
    # The profiled pass itself: single-tool cases whose workers profile themselves, measured once.
    line = campaign._case_profile_line(tmp_path, 2)
    said = line()
    assert said.startswith("its heaviest profile line, pyinstrument over "), said
    assert any(f"`{function} ({file}:" in said for function, file in campaign.CASE_CODE), said
    assert line() == said
