"""The nightly workflow's shard and merge steps, run here on a tiny plan; the pytest plugin.

The workflow (.github/workflows/chaos-nightly.yml) is read with PyYAML when it is installed,
else by its documented convention: the `run:` blocks of the steps named "Run the shard" and
"Merge the shards", the `env:` of the first, and the matrix entries (`- shard: I` then
`faults: "..."`). Each shard runs in a directory of its own, as on a runner of its own; its
uploaded directory is copied where the merge job downloads it.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from supervisor.chaos.nemesis.family import fault_names

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "chaos-nightly.yml"
DEFECTS = REPO / "tests" / "defects"
TINY_PLAN = "--mode random --seed 11 --runs 4 --scenario writes --jobs 2"
GITHUB = {"github.run_id": "4242", "github.run_attempt": "1"}
TIMEOUT_S = 300.0


# ---------------------------------------------------------------------------- reading the workflow
def _by_convention(text: str) -> dict[str, Any]:
    """The parts of the workflow this test needs, read without a YAML parser."""
    def block(step: str) -> tuple[str, dict[str, str]]:
        start = text.index(f"- name: {step}")
        lines = text[start:].splitlines()[1:]
        indent = len(lines[0]) - len(lines[0].lstrip())
        env: dict[str, str] = {}
        run: list[str] = []
        section = None
        for line in lines:
            if line.strip() and len(line) - len(line.lstrip()) < indent:
                break
            stripped = line.strip()
            if len(line) - len(line.lstrip()) == indent:
                section = stripped.split(":")[0]
                if section == "run" and not stripped.endswith("|"):
                    run.append(stripped.split(":", 1)[1].strip())
                continue
            if section == "env" and ":" in stripped:
                key, value = stripped.split(":", 1)
                env[key] = value.strip()
            elif section == "run":
                run.append(line[indent + 2:])
        return "\n".join(run) + "\n", env

    shard_run, shard_env = block("Run the shard")
    merge_run, _ = block("Merge the shards")
    head = text[: text.index("\njobs:")]
    env = dict(re.findall(r'^  ([A-Z_]+): "(.*)"$', head, re.M))
    matrix = [{"shard": int(i), "faults": f} for i, f in re.findall(r'- shard: (\d+)\n\s+faults: "(.*)"', text)]
    return {"env": env, "shard": (shard_run, shard_env), "merge": merge_run, "matrix": matrix,
            "upload": {"name": "chaos-shard-${{ matrix.shard }}", "path": "shard-report/"},
            "download": {"path": "shards"}, "merged_upload": "merged/"}


def _with_yaml(text: str) -> dict[str, Any]:
    import yaml

    flow = yaml.safe_load(text)
    shard_job, merge_job = flow["jobs"]["shard"], flow["jobs"]["merge"]

    def step(job: dict, name: str | None = None, uses: str | None = None) -> dict:
        return next(s for s in job["steps"] if (name and s.get("name") == name) or
                    (uses and s.get("uses", "").startswith(uses)))

    shard = step(shard_job, "Run the shard")
    uploads = [s for s in merge_job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    return {"env": flow["env"], "shard": (shard["run"], shard.get("env", {})),
            "merge": step(merge_job, "Merge the shards")["run"], "matrix": shard_job["strategy"]["matrix"]["include"],
            "upload": step(shard_job, uses="actions/upload-artifact")["with"],
            "download": step(merge_job, uses="actions/download-artifact")["with"],
            "merged_upload": uploads[-1]["with"]["path"]}


def workflow() -> dict[str, Any]:
    text = WORKFLOW.read_text(encoding="utf-8")
    try:
        import yaml  # noqa: F401
    except ImportError:
        return _by_convention(text)
    parsed, read = _with_yaml(text), _by_convention(text)
    for key in ("env", "shard", "merge", "matrix", "merged_upload"):
        assert read[key] == parsed[key], f"the convention reads {key} as YAML does"
    assert read["upload"].items() <= parsed["upload"].items() and read["download"].items() <= parsed["download"].items()
    return parsed


def expand(text: str, matrix: dict[str, Any]) -> str:
    """GitHub's `${{ }}` expressions of the convention: matrix values and run ids."""
    values = {f"matrix.{k}": str(v) for k, v in matrix.items()} | GITHUB
    out = re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", lambda m: values[m.group(1)], text)
    assert "${{" not in out, out
    return out


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A `run:` step as GitHub runs it: bash --noprofile --norc -eo pipefail."""
    proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                            text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_workflow_rotates_known_faults_over_its_shards() -> None:
    flow = workflow()
    matrix = flow["matrix"]
    assert [m["shard"] for m in matrix] == list(range(1, int(flow["env"]["SHARDS"]) + 1))
    sets = [tuple(f for f in m["faults"].split(",") if f) for m in matrix]
    assert len(set(sets)) == len(sets), "each shard runs under faults of its own"
    assert all(f in fault_names() and f != "disk" for s in sets for f in s), sets  # disk needs the right to mount
    assert "--mode random" in flow["env"]["CHAOS_ARGS"]


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_nightly_shard_and_merge_steps_run_here_on_a_tiny_plan(tmp_path: Path) -> None:
    if shutil.which("timeout") is None or shutil.which("bash") is None:
        pytest.skip("the workflow's steps need bash and coreutils' timeout")
    flow = workflow()
    env = os.environ | flow["env"] | {"CHAOS_ARGS": TINY_PLAN, "NO_PROXY": "127.0.0.1,localhost",
                                      "PYTHONPATH": str(REPO),
                                      "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    shard_run, shard_env = flow["shard"]
    downloads = tmp_path / "merge-job" / flow["download"]["path"]
    for entry in flow["matrix"]:
        job = tmp_path / f"shard-job-{entry['shard']}"
        job.mkdir()
        step_env = {k: expand(str(v), entry) for k, v in shard_env.items()}
        done = bash(expand(shard_run, entry), job, env | step_env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        shutil.copytree(job / flow["upload"]["path"], downloads / expand(flow["upload"]["name"], entry))
    merged = bash(flow["merge"], tmp_path / "merge-job", env)
    out = tmp_path / "merge-job" / flow["merged_upload"]
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.html").is_file()
    assert report["complete"] is True and report["cases"] == 4 + 1 and report["violations"] == []
    # Each shard's faults were met, not just asked for: every family landed at least once.
    assert report["faults_unlanded"] == [] and set(report["faults"]) == \
        {f for m in flow["matrix"] for f in m["faults"].split(",") if f}, report["faults"]
    assert report["campaign"]["id"] == "nightly-4242-1"
    assert [s["faults"] for s in report["campaign"]["shards"]] == \
        [[f for f in m["faults"].split(",") if f] for m in flow["matrix"]]
    # A timer that lands late on a loaded machine is not judged, which fails the job: nothing else may.
    assert merged.returncode == (1 if report["unknown"] else 0), merged.stdout[-3000:] + merged.stderr[-3000:]
    assert all(r["no_kill"] for r in report["results"] if r["verdict"]["valid"] is not True)


# ---------------------------------------------------------------------------- the pytest plugin
def _plugin_installed() -> bool:
    return any(ep.value == "supervisor.chaos.pytest_plugin"
               for ep in importlib.metadata.entry_points(group="pytest11"))


def pytest_run(tmp_path: Path, *args: str, defect: str | None = None) -> subprocess.CompletedProcess[str]:
    """`pytest --hermes-chaos ...` in an empty directory (so the session is the campaign alone)."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([*([str(DEFECTS / defect)] if defect else []), str(REPO)])
    load = [] if _plugin_installed() else ["-p", "supervisor.chaos.pytest_plugin"]
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *load, "-p", "no:cacheprovider", "--rootdir",
                             str(tmp_path), *args], cwd=tmp_path, env=env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_package_registers_the_plugin() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"hermes_chaos": "supervisor.chaos.pytest_plugin"}


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_pytest_runs_each_planned_case_as_an_item_over_xdist_workers(tmp_path: Path) -> None:
    done = pytest_run(tmp_path, "--hermes-chaos", "--scenario single-tool --probe flush.committed", "-n", "2",
                      "-v", "--junitxml", str(tmp_path / "junit.xml"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    names = sorted(case.get("name") for case in suite.iter("testcase"))
    assert names == sorted(["single-tool/fault-free"] +
                           [f"single-tool/probe:self@flush.committed:{n}@t0p0" for n in (1, 2, 3, 4)])
    assert "[gw0]" in done.stdout and "[gw1]" in done.stdout, "xdist spread the cases"
    repro = [p.get("value") for p in suite.iter("property") if p.get("name") == "repro"]
    assert sorted(repro) == sorted(f"hermes-supervisor chaos --case '{n}'" for n in names)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_fault_that_never_landed_fails_the_session_though_every_case_passed(tmp_path: Path) -> None:
    """single-tool's requests draw http500 and truncate from the model, never http429; its cases
    spread over two xdist workers. Every item passes, and the session fails naming http429 alone:
    the controller adds up what every worker's cases landed, and names no fault that landed."""
    args = "--scenario single-tool --probe flush.committed --faults http500,http429,truncate"
    done = pytest_run(tmp_path, "--hermes-chaos", args, "-n", "2")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "failed" not in done.stdout.splitlines()[-1], done.stdout[-1000:]
    assert "faults asked for that never landed: http429 (" in done.stdout, done.stdout[-1000:]


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_violating_case_fails_its_item_with_the_violations_and_the_repro_line(tmp_path: Path) -> None:
    done = pytest_run(tmp_path, "--hermes-chaos", "--scenario writes --probe tool.dispatch.after",
                      defect="ui_before_flush")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    case = "writes/probe:self@tool.dispatch.after:1@t0p0"
    assert f"FAILED hermes-chaos::{case}" in done.stdout
    assert "durable-before-visible (damage)" in done.stdout
    assert f"repro: hermes-supervisor chaos --case '{case}'" in done.stdout
    refused = pytest_run(tmp_path, "--hermes-chaos", "--mode double")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR and "--mode double" in refused.stderr
