"""The mutation score of the verdict (the `mutation` package, scripts/mutation).

Unit tests of what decides the score (stable ids, shards, merge, the reviewed triage), the
drift test of the block docs/chaos.md shows, and a small fixed sample of real durability
bugs made by cosmic-ray's operators, each of which the campaign oracle must kill.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mutation import casemap, launch, mutants, oracle, score, tree

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ ids and shards
SOURCE = textwrap.dedent("""\
    def f(a, b):
        if a == b:
            return a + 1
        return a + 1
""")


def _ids(root: Path) -> list[str]:
    return [m.id for m in mutants.enumerate_module(root, "m.py")]


def test_a_mutant_keeps_its_id_when_lines_move(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(SOURCE)
    before = _ids(tmp_path)
    (tmp_path / "m.py").write_text("import os\n\n\n" + SOURCE)
    after = [m for m in mutants.enumerate_module(tmp_path, "m.py") if "import" not in m.line_text]
    assert before and [m.id for m in after if m.id in before] == before
    # The two identical `return a + 1` lines: same text, told apart by their rank.
    same = [m for m in after if m.line_text == "return a + 1" and m.operator == "core/ReplaceBinaryOperator_Add_Sub"]
    assert [m.rank for m in same] == [0, 1] and len({m.id for m in same}) == 2


def test_shards_split_the_mutants_without_overlap() -> None:
    ids = [f"hermes/x.py:op:{i:010d}:0" for i in range(500)]
    for count in (1, 3, 7):
        parts = [{i for i in ids if mutants.in_shard(i, (k, count))} for k in range(1, count + 1)]
        assert sum(len(p) for p in parts) == len(ids) and set().union(*parts) == set(ids)
    assert mutants.parse_shard("3/8") == (3, 8)
    for bad in ("4/3", "0/2", "x", "3"):
        with pytest.raises(argparse.ArgumentTypeError, match="want I/N"):
            mutants.parse_shard(bad)


# ------------------------------------------------------------ merge and triage
def _shard(index: int, count: int, outcomes: dict[str, str], oracle_version: str = "o1") -> dict[str, Any]:
    return {"tool": "cosmic-ray test", "oracle": oracle_version, "groups": ["sqlite"], "shard": [index, count],
            "modules": {"hermes/x.py": {"digest": "d1", "made": 3, "mutants": {
                k: {"outcome": v, "operator": "core/AddNot", "line": 1, "line_text": k, "seconds": 2.0}
                for k, v in outcomes.items()}}}}


def test_merge_joins_shards_and_refuses_mixed_oracles() -> None:
    merged = score.merge([_shard(1, 2, {"a": "killed"}), _shard(2, 2, {"b": "survived", "c": "killed"})])
    record = merged["modules"]["hermes/x.py"]
    assert set(record["mutants"]) == {"a", "b", "c"} and not record["incomplete"]
    assert score.merge([_shard(1, 2, {"a": "killed"})])["modules"]["hermes/x.py"]["incomplete"]
    with pytest.raises(score.MergeError):
        score.merge([_shard(1, 2, {}), _shard(2, 2, {}, oracle_version="o2")])
    with pytest.raises(score.MergeError):
        score.merge([_shard(1, 2, {}), _shard(1, 2, {})])


def test_triage_counts_only_entries_that_match_a_surviving_mutant(tmp_path: Path) -> None:
    line = "if not turn.flush(messages):"
    survivor_id = score.triage_key("hermes/x.py", "core/AddNot", line, 0)
    killed_id = score.triage_key("hermes/x.py", "core/AddNot", "x = 1", 0)
    shard = _shard(1, 1, {survivor_id: "survived", killed_id: "killed"})
    (tmp_path / "t.toml").write_text(textwrap.dedent(f"""\
        [[equivalent]]
        module = "hermes/x.py"
        operator = "core/AddNot"
        line = "{line}"
        reason = "test"

        [[equivalent]]
        module = "hermes/x.py"
        operator = "core/AddNot"
        line = "x = 1"
        reason = "killed, so this entry is stale"

        [[survivor]]
        module = "hermes/y.py"
        operator = "core/AddNot"
        line = "y = 1"
        reason = "a module this run did not reach: kept, not stale"
    """))
    fig = score.figures(score.merge([shard]), score.load_triage(tmp_path / "t.toml"))
    row = fig["modules"]["hermes/x.py"]
    assert (row["killed"], row["equivalent"], row["survived"]) == (1, 1, 0)
    assert [e["id"] for e in row["equivalents"]] == [survivor_id]
    assert fig["stale_triage"] == [{"kind": "equivalent", "module": "hermes/x.py", "line": "x = 1",
                                    "operator": "core/AddNot"}]
    (tmp_path / "bad.toml").write_text('[[equivalent]]\nmodule = "m"\noperator = "o"\nline = "l"\nreason = " "\n')
    with pytest.raises(ValueError):
        score.load_triage(tmp_path / "bad.toml")


def test_mutants_of_annotations_are_counted_apart_not_as_made_or_equivalent(tmp_path: Path) -> None:
    shard = _shard(1, 1, {"a": "killed", "b": "annotation", "c": "survived"})
    (tmp_path / "t.toml").write_text("")
    row = score.figures(score.merge([shard]), score.load_triage(tmp_path / "t.toml"))["modules"]["hermes/x.py"]
    assert (row["made"], row["in_annotations"], row["run"], row["equivalent"]) == (2, 1, 2, 0)
    table = score.render({"tool": "t", "oracle_groups": ["sqlite"], "modules": {"hermes/x.py": row},
                          "cost_seconds_per_mutant": {}})
    assert "| `hermes/x.py` | 2 | 2 | 1 | 0 | 1 (0) | 0 | 50 % | 1 |" in table


def test_the_reviewed_triage_file_parses() -> None:
    found = score.load_triage(REPO / "mutation" / "triage.toml")
    for kind in (found["equivalent"], found["survivor"]):
        for entry in kind.values():
            assert entry["module"] in tree.core_modules(REPO), entry


def test_the_mutation_score_is_a_declared_figure_block() -> None:
    """docs/chaos.md's score is rendered like every generated block (scripts/figures.py, whose drift
    test covers it), from docs/figures/mutation.json with the reviewed triage's words."""
    import docfigures
    from docfigures import mutation as figure

    block = docfigures.BLOCKS["mutation"]
    assert block.pages == ("docs/chaos.md",) and block.reads == ("mutation",)
    assert docfigures.MEASUREMENTS["mutation"].store == REPO / "docs" / "figures" / "mutation.json"
    assert figure.block() == score.render(score.retriaged(json.loads(figure.STORE.read_text()),
                                                          score.load_triage(figure.TRIAGE)))


def test_a_reason_sharpened_after_a_run_is_what_the_figure_shows() -> None:
    measured = {"modules": {"hermes/x.py": {
        "survivors": [{"id": "s", "needs": "as triaged at the run"}, {"id": "u", "needs": "not yet triaged"}],
        "equivalents": [{"id": "e", "reason": "old"}]}}}
    triage = {"survivor": {"s": {"reason": "killed since, by a sharper check"}},
              "equivalent": {"e": {"reason": "new"}}}
    row = score.retriaged(measured, triage)["modules"]["hermes/x.py"]
    assert [s["needs"] for s in row["survivors"]] == ["killed since, by a sharper check", "not yet triaged"]
    assert row["equivalents"] == [{"id": "e", "reason": "new"}]
    assert measured["modules"]["hermes/x.py"]["survivors"][0]["needs"] == "as triaged at the run"


def test_the_oracle_finds_the_mutated_statement(tmp_path: Path) -> None:
    pristine, mutant = tmp_path / "p", tmp_path / "m"
    module = "hermes/finalizer.py"
    for root in (pristine, mutant):
        (root / module).parent.mkdir(parents=True)
        shutil.copy(REPO / module, root / module)
    source = (REPO / module).read_text()
    number = source.splitlines().index("    if not turn.flush(messages):") + 1
    (mutant / module).write_text(source.replace("    if not turn.flush(messages):", "    if turn.flush(messages):"))
    assert oracle.mutated(pristine, mutant) == (module, {number})
    # A change inside a statement spread over lines is reported by the statement's first line too.
    assert casemap.statement_lines("x = f(\n    1,\n    2)\n", {3}) == {1, 3}


def test_the_nightly_mutation_jobs_cover_every_shard_and_merge_them() -> None:
    """Job `mutation` runs shard I/N for every I of its matrix (N its size), job `mutation-merge`
    joins what they upload; both command lines parse as scripts/mutation takes them."""
    import re
    import shlex

    import yaml

    from mutation.__main__ import _parser

    flow = yaml.safe_load((REPO / ".github" / "workflows" / "chaos-nightly.yml").read_text())
    job, merge = flow["jobs"]["mutation"], flow["jobs"]["mutation-merge"]
    shards = job["strategy"]["matrix"]["shard"]
    run = next(s for s in job["steps"] if s.get("name") == "Run the mutation shard")["run"]
    count = int(re.search(r'--shard "\$SHARD/(\d+)"', run).group(1))
    assert sorted(shards) == list(range(1, count + 1))
    for shard in shards:
        line = re.search(r"scripts/mutation (run .*)", run).group(1).replace("$SHARD", str(shard))
        assert _parser().parse_args(shlex.split(line)).shard == (shard, count)
    merged = next(s for s in merge["steps"] if s.get("name") == "Merge the mutation shards")["run"]
    args = _parser().parse_args(shlex.split(re.search(r"scripts/mutation (merge .*)", merged).group(1)))
    assert args.verb == "merge" and merge["needs"] == "mutation"


def test_the_nightly_shards_run_on_case_maps_built_once_per_group() -> None:
    """Job `mutation-map` maps each oracle group on a runner of its own; every shard waits for it and
    is given what it uploaded, so no shard maps a group again unless that group's job left no map."""
    import re
    import shlex

    import yaml

    from mutation.__main__ import _parser

    flow = yaml.safe_load((REPO / ".github" / "workflows" / "chaos-nightly.yml").read_text())
    mapper, shard = flow["jobs"]["mutation-map"], flow["jobs"]["mutation"]
    groups = mapper["strategy"]["matrix"]["group"]
    assert sorted(groups) == sorted(launch.GROUPS)
    command = next(s for s in mapper["steps"] if s.get("name") == "Map the group")["run"]
    for group in groups:
        line = re.search(r"scripts/mutation (map .*)", command).group(1).replace("$GROUP", group)
        assert _parser().parse_args(shlex.split(line)).group == [group]
    uploaded = next(s for s in mapper["steps"] if s.get("name") == "Upload the group's case map")["with"]
    downloaded = next(s["with"] for s in shard["steps"] if "download-artifact" in s.get("uses", ""))
    assert uploaded["name"].replace("${{ matrix.group }}", "*") == downloaded["pattern"]
    assert shard["needs"] == "mutation-map"
    run = next(s for s in shard["steps"] if s.get("name") == "Run the mutation shard")["run"]
    line = re.search(r"scripts/mutation (run .*)", run).group(1).replace("$SHARD", "1")
    assert _parser().parse_args(shlex.split(line)).maps == [Path(downloaded["path"])]


# ------------------------------------------------------------ the CI sample
# Real durability bugs, each made by one of cosmic-ray's operators on one line of the core, and a
# case of the campaign that must catch it: (module, operator, the line's text, oracle group, case id,
# and the mutant's rank among that operator's on the line when it is not the first).
# The group is named, not read from the case id: a storage group's faults apply to every case it
# plans, so its case ids are the sqlite group's.
SAMPLE = [
    # A flush that succeeded is taken for a failed one: the turn is reported failed and never reaches
    # finalize.after, so the kill planned there never fires (`coverage`).
    ("hermes/finalizer.py", "core/ReplaceUnaryOperator_Delete_Not", "if not turn.flush(messages):",
     "sqlite", "single-tool/probe:self@finalize.after:1@t0p0"),
    # No dispatch intent is ever written: tools run with nothing durable saying they might have.
    ("hermes/store/dispatches.py", "core/ZeroIterationForLoop", "for i in intents:", "sqlite", "single-tool/fault-free"),
    # Recovery reruns an at-most-once call whose outcome is unknown, and records idempotent ones as unknown.
    ("hermes/resume.py", "core/ReplaceComparisonOperator_Eq_NotEq",
     'if intent is None or intent["policy"] == IDEMPOTENT:', "sqlite", "writes/probe:self@tool.dispatch.after:1@t0p0"),
    # A new effects ledger never gets its tables: no execution of any tool is recorded.
    ("worker/ledger.py", "core/AddNot",
     "if present < 2:  # a new ledger (or one left half-made): create what is missing, in one transaction",
     "sqlite", "single-tool/fault-free"),
    # A call a Ctrl-C cut off before its tool started, its intent committed, is answered "cancelled":
    # the transcript says it never ran when it may have. Only the interrupt group reaches it.
    ("hermes/outcomes.py", "core/AddNot", "if dispatched:", "interrupt",
     "single-tool/interrupt:self@tool.dispatch.before:1@t0p0"),
    # The streamed answer's row is looked for at the transcript's start instead of its end: in a first
    # turn that is the same row, so only a conversation streaming a later turn's answer (drawn: the
    # generated group) shows the commit differing from what was streamed.
    ("hermes/finalizer.py", "core/ReplaceUnaryOperator_Delete_USub", "last = messages[-1] if messages else None",
     "generated", "gen-42c445fe8f2d/fault-free"),
    # A resumed turn finds its question empty: every row and the answer stay right, only the trajectory
    # log the turn writes shows it (`outcome-honesty`); the self-kill scenario resumes in its baseline.
    ("hermes/resume.py", "core/ReplaceComparisonOperator_IsNot_Is",
     'return message.get("content") if message.get("content") is not None else ""', "sqlite", "self-kill/fault-free"),
    # A dispatch intent is no longer a barrier: at NORMAL its commit is not synced before the tool
    # runs, and a cut that drops every unsynced write (this case's crash mode) takes the intent of a
    # call whose effect happened. At FULL every commit syncs, so only the NORMAL power-cut group sees it.
    ("hermes/store/dispatches.py", "core/ReplaceTrueWithFalse",
     "return self._execute_write(write, session_id=session_id, barrier=True)", "power-loss-normal",
     "single-tool/probe:self@tool.dispatch.after:1@t0p0"),
    # Recovery reads the intents of every turn, not only its own: with fresh call ids no other turn's
    # intent shares an id, but a model that numbers its calls (the generated group's) repeats them
    # across turns, and an earlier turn's intent is taken for this one's.
    ("hermes/store/dispatches.py", "core/AddNot", "if turn_id is not None:", "generated",
     "gen-e997d28970da/probe:self@tool.dispatch.before:6@t2p1+probe:self@turn.start:1@t4p0"),
    # The append flags lose O_WRONLY: the trajectory log cannot be written, which costs a warning, not
    # the turn; every turn a worker reports finishing then has no line (`outcome-honesty`).
    ("hermes/private_files.py", "core/ReplaceBinaryOperator_BitOr_BitAnd",
     '_FLAGS = {"w": os.O_WRONLY | os.O_TRUNC, "a": os.O_WRONLY | os.O_APPEND}', "sqlite", "single-tool/fault-free", 1),
    # The append flags become a float: os.open raises TypeError after the turn is done, and the worker
    # exits with a traceback and no outcome (`outcome-honesty`).
    ("hermes/private_files.py", "core/ReplaceBinaryOperator_BitOr_Div",
     '_FLAGS = {"w": os.O_WRONLY | os.O_TRUNC, "a": os.O_WRONLY | os.O_APPEND}', "sqlite", "single-tool/fault-free", 1),
    # The daemon cannot end a turn it gives up (its calls' words refuse the reason): the turn goes on
    # running where it should have ended failed (`turn-liveness`). Only the give-up group ends turns.
    ("hermes/outcomes.py", "core/AddNot", "if why not in _ENDED_UNKNOWN:", "give-up",
     "mixed-batch/probe:self@callback.interim.after:1@t0p0"),
    # A turn the daemon ended answers its dispatched calls "not run" and the others "unknown".
    ("hermes/outcomes.py", "core/AddNot", "if dispatched:", "give-up",
     "mixed-batch/probe:self@callback.interim.before:1@t0p0", 1),
    # A recovery whose write of a reconciled tool result failed goes on with the turn: only a storage
    # fault makes that write fail (the storage group; `well-formed` sees the turn's rows go on).
    ("hermes/resume.py", "core/ReplaceFalseWithTrue", "return False", "storage",
     "mixed-batch/probe:self@callback.interim.after:1@t0p0"),
    # Recovery's handler of a failed read no longer catches it: only the storage group's `corrupt`
    # round that damages the transcript's table alone lets a resuming worker read its turn and then
    # fail reading its rows; the worker exits without an outcome (`outcome-honesty`, `fails-closed`).
    ("hermes/resume.py", "core/ExceptionReplacer", "except sqlite3.Error as exc:", "storage",
     "single-tool/probe:self@flush.begin:2@t0p0"),
    # A compaction inside a turn archives only up to an older turn's second-last row: the rows after it
    # are cloned back after the summary with the running turn's, and the model sees an older turn twice
    # (`well-formed`: the clones a compaction keeps are one turn's, from its question on).
    ("hermes/compaction.py", "core/NumberReplacer",
     'db.archive_and_compact(session, [_summary_row(summary)], watermark=older[-1]["_row_id"])', "sqlite",
     "multi-turn-compaction/fault-free"),
    # The busy retry's deadline is a product, not a sum: a worker that meets a locked database waits
    # without end instead of failing closed within its budget. The `locked` fault releases the lock
    # a second past that budget, counted from the worker's next write, so the turn it then finishes
    # is its failure to give up (`fails-closed`).
    ("hermes/store/connection.py", "core/ReplaceBinaryOperator_Add_Mul", "deadline = time.monotonic() + budget_s",
     "storage", "single-tool/fault-free"),
    # Model calls are never counted on their turn (found by the sample of shard 3): the turn's limit
    # no longer holds across restarts, and the daemon reports 0 calls (`outcome-honesty`).
    ("hermes/turn.py", "core/AddNot", "if db is None or self.id is None:", "sqlite", "single-tool/fault-free"),
    # A large result is never spilled, or every small one is (found by the sample of shard 4): the
    # text stays whole either way, so only the promise of where our runtime spills shows it.
    ("hermes/executor.py", "core/ReplaceComparisonOperator_LtE_NotEq",
     "if len(content) <= threshold or spill_dir is None:", "sqlite", "parallel-read/fault-free"),
    ("hermes/executor.py", "core/AddNot",
     "if len(content) <= threshold or spill_dir is None:", "sqlite", "single-tool/fault-free"),
    # The limit one character off either way, or a result at the limit spilled: `parallel-read`
    # holds one result right at the limit and one just over it.
    ("hermes/executor.py", "core/NumberReplacer", "SPILL_THRESHOLD_CHARS = 100_000", "sqlite", "parallel-read/fault-free"),
    ("hermes/executor.py", "core/NumberReplacer", "SPILL_THRESHOLD_CHARS = 100_000", "sqlite", "parallel-read/fault-free",
     1),
    ("hermes/executor.py", "core/ReplaceComparisonOperator_LtE_Lt",
     "if len(content) <= threshold or spill_dir is None:", "sqlite", "parallel-read/fault-free"),
    # The session is never compacted between turns (its guard inverted): compaction inside the next
    # turn, after its tool block, still bounds the transcript, but the turn began on the whole history
    # (`compaction-bound`).
    ("hermes/compaction.py", "core/ReplaceComparisonOperator_Is_IsNot", "if db is None or max_active_rows <= 0:",
     "sqlite", "multi-turn-compaction/fault-free"),
    # The converse: compacted at exactly the bound, not over it. The third turn leaves five live rows,
    # the bound, two turns of them older than the fourth: the session is summarized before the fourth,
    # which was not due (`compaction-bound`).
    ("hermes/compaction.py", "core/ReplaceComparisonOperator_LtE_Lt", "if len(messages) <= max_active_rows:",
     "sqlite", "multi-turn-compaction/fault-free"),
    # Compacted inside a turn only before its first model call, never at a tool block's end: a drawn
    # turn that begins within its bound and whose tool block takes it over asks the model again with the
    # previous turn's rows unsummarized (`compaction-bound`, promised inside turns too).
    ("hermes/compaction.py", "core/ReplaceUnaryOperator_Delete_Not",
     "if db is None or max_active_rows <= 0 or turn.id is None or not _at_block_boundary(messages):", "generated",
     "gen-fdcaedd0d69b/fault-free"),
    # A summary is no longer recognized (its role test inverted): a drawn turn whose older rows are one
    # earlier summary summarizes it again, inside the turn and before the next (`compaction-bound`:
    # a compaction summarizes some row of an older turn).
    ("hermes/compaction.py", "core/ReplaceComparisonOperator_Eq_NotEq",
     'return (message.get("role") == "user" and message.get("_turn_id") is None', "generated",
     "gen-fdcaedd0d69b/fault-free"),
]


@pytest.mark.parametrize("sample", SAMPLE, ids=[s[0] for s in SAMPLE])
def test_the_campaign_oracle_kills_the_sample_mutant(tmp_path: Path, sample: tuple[Any, ...]) -> None:
    from cosmic_ray.mutating import apply_mutation
    from cosmic_ray.plugins import get_operator

    module, operator, line, group, case_id, *rank = sample
    found = sorted((m for m in mutants.enumerate_module(REPO, module) if m.operator == operator and m.line_text == line),
                   key=lambda m: m.line)
    assert found, f"the sample mutant is gone from {module}: update SAMPLE"
    mutant = found[rank[0] if rank else 0]  # of lines with the same text, the first; on it, by rank
    copy = tree.copy_tree(REPO, tmp_path / "tree")
    _, mutated = apply_mutation(copy / module, get_operator(operator)(), mutant.occurrence)
    assert mutated is not None
    # A case map holding just the sample's case, for that line: the oracle's own path from there.
    the_map = {"groups": {group: {"cases": [case_id], "case_seconds": [1.0],
                                  "lines": {module: {str(mutant.line): [0]}}}}}
    verdict = oracle.judge(REPO, copy, the_map, budget=120)
    assert verdict["outcome"] == "killed", verdict
    assert verdict["case"] == case_id and verdict["by"], verdict


def test_a_line_only_the_checker_runs_is_judged_with_the_supervisor_running_the_mutant(tmp_path: Path) -> None:
    """No worker opens a snapshot of the session database; the checker reads every case through one.
    A snapshot that retries its copy until it gives up (its `break` made `continue`) leaves every
    case unjudged, but only a supervisor importing the mutant runs it: the oracle starts one there."""
    from cosmic_ray.mutating import apply_mutation
    from cosmic_ray.plugins import get_operator

    module, operator = "hermes/store/snapshot.py", "core/ReplaceBreakWithContinue"
    [mutant] = [m for m in mutants.enumerate_module(REPO, module) if m.operator == operator]
    copy = tree.copy_tree(REPO, tmp_path / "tree")
    _, mutated = apply_mutation(copy / module, get_operator(operator)(), mutant.occurrence)
    assert mutated is not None
    case_id = "single-tool/fault-free"
    the_map = {"groups": {"sqlite": {"cases": [case_id], "case_seconds": [1.0], "lines": {},
                                     "checker_lines": {module: [mutant.line]}}}}
    verdict = oracle.judge(REPO, copy, the_map, budget=120)
    assert verdict["side"] == "checker" and verdict["outcome"] == "killed", verdict
    assert verdict["case"] == case_id and verdict["by"], verdict
    # Executed by a worker too, the line is judged with the supervisor pristine: it never runs there.
    the_map["groups"]["sqlite"]["lines"] = {module: {str(mutant.line): [0]}}
    verdict = oracle.judge(REPO, copy, the_map, budget=120)
    assert verdict["side"] == "workers" and verdict["outcome"] == "survived", verdict


def test_the_case_map_credits_what_the_checker_ran_to_every_case_of_its_group(tmp_path: Path) -> None:
    """The supervisor's own data file (the process that ran the campaign) holds the checker's lines:
    the group's, not any case's, and not a template's (credited to every case's workers)."""
    import coverage

    module = tmp_path / "hermes" / "reader.py"
    module.parent.mkdir()
    module.write_text("a = 1\nb = 2\nc = 3\n")
    for pid, lines in ((100, [1, 2]), (200, [3])):  # the supervisor's, a worker's
        data = coverage.CoverageData(basename=str(tmp_path / f"cov.{pid}"))
        data.add_lines({str(module): lines})
        data.write()
    ran = ["writes/fault-free", "writes/probe:self@flush.begin:1@t0p0"]
    outcome = launch.Outcome(ran=ran, spawned=[(200, ran[1])], runner_pid=100)
    entry = casemap._group_map(tmp_path, tmp_path, outcome, 1.0)
    assert entry["checker_lines"] == {"hermes/reader.py": [1, 2]}
    assert set(entry["lines"]["hermes/reader.py"]) == {"3"}
    the_map = {"groups": {"sqlite": entry}}
    assert casemap.chosen_cases(the_map, "hermes/reader.py", {2}) == ("checker", {"sqlite": entry["cases"]})
    assert casemap.chosen_cases(the_map, "hermes/reader.py", {3}) == ("workers", {"sqlite": [ran[1]]})
    assert casemap.chosen_cases(the_map, "hermes/reader.py", {4}) == ("checker", {})


def test_a_case_failing_on_the_original_code_is_no_oracle(tmp_path: Path) -> None:
    """A case whose campaign fails without any mutant cannot tell a mutant from the original: the
    case map leaves it out (no mutant is ever judged by it) and names it."""
    from mutation import casemap, launch

    ran = ["writes/fault-free", "writes/probe:self@flush.begin:1@t0p0", "writes/pause:self@flush.begin:3@t0p0"]
    outcome = launch.Outcome(ran=ran, failed=ran[2], failures=[ran[2]])
    entry = casemap._group_map(tmp_path, tmp_path, outcome, 1.0)
    assert entry["cases"] == ran[:2] and entry["failing"] == [ran[2]]
    fig = score.figures(score.merge([dict(_shard(1, 1, {"a": "killed"}), failing={"pause": [ran[2]]})]),
                        {"equivalent": {}, "survivor": {}})
    assert fig["failing_on_the_original"] == {"pause": [ran[2]]}
    assert f"`pause` `{ran[2]}`" in score.render(fig)


def test_the_normal_power_cut_group_excuses_that_levels_cost_and_nothing_else(tmp_path: Path) -> None:
    """At NORMAL a cut after the answer's commit takes that commit (this case's crash mode drops every
    unsynced write): the campaign says FAIL, with one `durability-cost` finding and no damage. The
    original code does that, so the oracle's NORMAL group counts the case as passing; the sample
    mutant above, which also does damage there, is killed by the same group."""
    case = "single-tool/probe:self@finalize.after:1@t0p0"
    report = tmp_path / "report"
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", "--case", case, "--faults", "power-loss",
                           "--synchronous", "NORMAL", "--report", str(report)], cwd=REPO, env=env, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=300, start_new_session=True)
    assert done.returncode == 1, done.stdout + done.stderr
    found = {(v["invariant"], v["class"]) for v in json.loads((report / "report.json").read_text())["violations"]}
    assert found == {("power-cut-durability", "durability-cost")}, found

    outcome = launch.run_group(REPO, "power-loss-normal", [case])
    assert outcome.ran == [case] and outcome.failures == [] and outcome.failed is None, outcome


@pytest.mark.parametrize("ending", ["SIGKILL", "SIGINT"])
def test_the_case_map_measures_a_worker_that_ends_itself_by_a_signal(tmp_path: Path, ending: str) -> None:
    """atexit never runs in a process a signal ends: the map's coverage hook saves first, and only at
    the end (a SIGINT that still raises KeyboardInterrupt is a Ctrl-C the program goes on from)."""
    program = tmp_path / "ends.py"
    program.write_text(
        "import os, signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the test run inherited\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    answered = True\n"
        "if os.environ['ENDING'] == 'SIGINT':\n"
        "    signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
        "os.kill(os.getpid(), getattr(signal, os.environ['ENDING']))\n"
        "never = True\n")
    returncode, _pid, stderr, lines = _measured(program, ENDING=ending)
    assert returncode == -getattr(signal, ending), stderr
    [lines] = lines.values()
    assert {6, 9} <= lines and 10 not in lines, sorted(lines)


def _measured(program: Path, **env: str) -> tuple[int, int, str, dict[int, set[int]]]:
    """Run `program` under the case map's coverage hook: its exit status, pid and standard error,
    and the lines of `program` each process saved, by pid."""
    import coverage

    (program.parent / "sitecustomize.py").write_text(casemap.SITECUSTOMIZE)
    data = program.parent / "coverage"
    data.mkdir()
    proc = subprocess.Popen([sys.executable, str(program)], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(program.parent), MUTATION_COVERAGE_DIR=str(data),
                                     MUTATION_COVERAGE_INCLUDE=str(program), **env))
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a hang: killed by its recorded pid, with anything it forked
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = {}
    for saved in data.glob("cov.*"):
        measured = coverage.CoverageData(basename=str(saved))
        measured.read()
        lines[int(saved.name.split(".")[1])] = set(measured.lines(str(program)) or ())
    return proc.returncode, proc.pid, stderr, lines


def test_the_case_map_measures_a_forked_worker_apart_from_its_template(tmp_path: Path) -> None:
    """Workers are forked from a warm template: each child's data file holds what it ran after the
    fork, and the template's own (saved when it exits) what it ran before, which the map credits to
    every case; no line is lost and none is counted for the wrong process."""
    program = tmp_path / "template.py"
    program.write_text(
        "import os\n"
        "def work():\n"
        "    return True\n"
        "before = True\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    work()  # as the template's child runs the worker: in a call made after the fork\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "after = True\n")
    returncode, template, stderr, lines = _measured(program)
    assert returncode == 0, stderr
    [child] = [pid for pid in lines if pid != template]
    assert {1, 2, 4, 5, 9, 10} <= lines[template] and 3 not in lines[template], lines
    assert 3 in lines[child] and not {1, 2, 4, 5} & lines[child], lines

    ran = ["writes/fault-free", "writes/probe:self@flush.begin:1@t0p0"]
    outcome = launch.Outcome(ran=ran, spawned=[(child, ran[1])])
    entry = casemap._group_map(tmp_path, tmp_path / "coverage", outcome, 1.0)
    rel = program.name
    assert [entry["cases"][i] for i in entry["lines"][rel]["4"]] == ran  # the template's: every case
    assert [entry["cases"][i] for i in entry["lines"][rel]["3"]] == [ran[1]]  # the child's: its case


def test_a_run_of_one_module_keeps_the_shards_other_modules(tmp_path: Path) -> None:
    from mutation.run import _carry_over

    (tmp_path / "hermes").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "hermes" / name).write_text(f"X = '{name}'\n")
    measured = {m: {"digest": tree.file_digest(tmp_path / m), "made": 1, "mutants": {"id": {"outcome": "killed"}}}
                for m in ("hermes/a.py", "hermes/b.py")}
    previous = {"oracle": "o1", "groups": ["sqlite"], "modules": measured}
    results: dict[str, Any] = {"oracle": "o1", "groups": ["sqlite"], "modules": {}}
    _carry_over(previous, results, tmp_path)
    assert results["modules"] == measured
    (tmp_path / "hermes" / "b.py").write_text("X = 'changed'\n")  # measured on another text: dropped
    results = {"oracle": "o1", "groups": ["sqlite"], "modules": {}}
    _carry_over(previous, results, tmp_path)
    assert list(results["modules"]) == ["hermes/a.py"]
    for other in ({"oracle": "o2", "groups": ["sqlite"]}, {"oracle": "o1", "groups": ["sqlite", "pause"]}):
        results = dict(other, modules={})  # another oracle: nothing of the old one is kept
        _carry_over(previous, results, tmp_path)
        assert results["modules"] == {}


def test_the_case_map_is_kept_group_by_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped while it maps one group keeps the groups it mapped before: the next run maps only
    the rest (a nightly shard that ran out of time mid-map starts where it stopped)."""
    from mutation import run

    built: list[str] = []

    def build(pristine: Path, work: Path, groups: list[str], **_: Any) -> dict[str, Any]:
        (group,) = groups
        if group == "pause" and "pause" not in built:
            built.append(group)
            raise KeyboardInterrupt  # stopped while mapping its second group
        built.append(group)
        return {"code_version": "v", "scenarios": [],
                "groups": {group: {"cases": [], "case_seconds": [], "failing": [], "lines": {}}}}

    monkeypatch.setattr(casemap, "build", build)
    with pytest.raises(KeyboardInterrupt):
        run.prepare(REPO, tmp_path, ["sqlite", "pause", "interrupt"], log=lambda _line: None)
    assert built == ["sqlite", "pause"]
    state = run.prepare(REPO, tmp_path, ["sqlite", "pause", "interrupt"], log=lambda _line: None)
    assert built == ["sqlite", "pause", "pause", "interrupt"]  # sqlite was not mapped again
    assert sorted(state["map"]["groups"]) == ["interrupt", "pause", "sqlite"]
    assert sorted(casemap.load(state["map_path"])["groups"]) == ["interrupt", "pause", "sqlite"]


def test_a_run_takes_the_groups_other_jobs_mapped_for_its_code_and_maps_only_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Maps given to a run (files, or directories holding them) stand for their groups when they were
    built from this code over the same scenarios; one built from other code is named and not used."""
    from mutation import run

    built: list[str] = []

    def build(pristine: Path, work: Path, groups: list[str], **_: Any) -> dict[str, Any]:
        built.extend(groups)
        return {"code_version": tree.code_version(pristine, tree.listed_files(pristine)), "scenarios": [],
                "groups": {g: {"cases": [f"{g}/fault-free"], "case_seconds": [1.0], "failing": [], "lines": {}}
                           for g in groups}}

    monkeypatch.setattr(casemap, "build", build)
    elsewhere = tmp_path / "maps"
    for group in ("sqlite", "pause"):  # two map jobs, each on its own runner, each in its own work directory
        run.prepare(REPO, elsewhere / group, [group], log=lambda _line: None)
    assert built == ["sqlite", "pause"]
    stale = elsewhere / "old" / "casemap-0000.json"
    stale.parent.mkdir(parents=True)
    casemap.save({"code_version": "0000", "scenarios": [],
                  "groups": {"interrupt": {"cases": [], "case_seconds": [], "failing": [], "lines": {}}}}, stale)
    said: list[str] = []
    state = run.prepare(REPO, tmp_path / "shard", ["sqlite", "pause", "interrupt"], log=said.append,
                        given=[elsewhere])
    assert built == ["sqlite", "pause", "interrupt"]  # only the group no usable map held
    assert state["map"]["groups"]["pause"]["cases"] == ["pause/fault-free"]
    assert any(str(stale) in line and "not used" in line for line in said), said
    assert sorted(casemap.load(state["map_path"])["groups"]) == ["interrupt", "pause", "sqlite"]


def test_the_oracle_learns_at_once_that_its_driver_is_gone() -> None:
    """cosmic-ray starts the oracle through a shell in a session of its own: when the run that drives
    it ends, only a watch on that process tells the oracle to stop its campaign."""
    import threading

    driver = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone = threading.Event()
    try:
        oracle.watch_process(driver.pid, gone.set)
        assert not gone.is_set()
    finally:
        driver.stdin.close()  # it ends on its own
        driver.wait(timeout=30)
    assert gone.wait(timeout=30)
    dead = threading.Event()
    oracle.watch_process(driver.pid, dead.set)  # reaped already: no such process
    assert dead.is_set()


def test_a_stopped_oracle_starts_no_further_campaign(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def run_group(_tree: Path, group: str, cases: list[str], **_kwargs: Any) -> launch.Outcome:
        ran.append(group)
        launch.stop_running("driver gone")  # stopped while this group ran
        return launch.Outcome(ran=cases)

    monkeypatch.setattr(launch, "_stopped", [])
    monkeypatch.setattr(launch, "run_group", run_group)
    monkeypatch.setattr(oracle, "mutated", lambda _p, _m: ("hermes/m.py", {3}))
    the_map = {"groups": {g: {"cases": ["single-tool/fault-free"], "case_seconds": [1.0],
                              "lines": {"hermes/m.py": {"3": [0]}}} for g in ("sqlite", "interrupt")}}
    verdict = oracle.judge(Path("p"), Path("m"), the_map, budget=60)
    assert ran == ["sqlite"] and verdict["outcome"] == "stopped" and verdict["why"] == "driver gone"


def test_a_stopped_run_makes_no_work_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Told to stop (the driver gone, a signal), each mutant still queued asks for its campaign: none
    # may leave a directory behind, as dozens of empty ones in the temporary directory showed.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(launch, "_stopped", ["driver gone"])
    outcome = launch.run_group(tmp_path, "sqlite", ["single-tool/fault-free"])
    assert outcome.timed_out and outcome.ran == []
    assert list(tmp_path.iterdir()) == []


def _judge_a_crashing_campaign(monkeypatch: pytest.MonkeyPatch, crash: Exception, workers: int) -> dict[str, Any]:
    """The oracle's verdict on a mutant whose campaign raises `crash` once `workers` workers started."""
    def run_group(_tree: Path, group: str, cases: list[str], **_kwargs: Any) -> launch.Outcome:
        launch._spawned.extend([4242] * workers)
        raise crash

    monkeypatch.setattr(launch, "_stopped", [])
    monkeypatch.setattr(launch, "_spawned", [])
    monkeypatch.setattr(launch, "run_group", run_group)
    monkeypatch.setattr(oracle, "mutated", lambda _p, _m: ("hermes/m.py", {3}))
    the_map = {"groups": {"sqlite": {"cases": ["single-tool/fault-free"], "case_seconds": [1.0],
                                     "lines": {"hermes/m.py": {"3": [0]}}}}}
    return oracle.judge(Path("p"), Path("m"), the_map, budget=60)


@pytest.mark.parametrize("workers_before_the_crash", [0, 1], ids=["before-any-worker", "after-a-worker"])
def test_a_campaign_that_crashes_kills_the_mutant_only_once_a_worker_ran_it(
        monkeypatch: pytest.MonkeyPatch, workers_before_the_crash: int) -> None:
    """The supervisor and its checker are pristine: a campaign that fails before any worker (the only
    place the mutant lives) started failed for a reason of the harness's, a setting the measured tree
    does not know for one; that is an error to measure again, never a kill."""
    crash = TypeError("CampaignConfig.__init__() got an unexpected keyword argument 'call_ids'")
    verdict = _judge_a_crashing_campaign(monkeypatch, crash, workers_before_the_crash)
    if workers_before_the_crash:
        assert verdict["outcome"] == "killed" and verdict["by"] == ["campaign-crashed:TypeError"]
    else:
        assert verdict["outcome"] == "error" and "before any worker started" in verdict["detail"]
        assert "call_ids" in verdict["detail"]


def test_a_worker_template_that_cannot_import_the_mutant_kills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The template imports the measured tree before any worker is forked: a mutant that makes the
    runtime unimportable (a TYPE_CHECKING guard inverted into a circular import) fails every campaign."""
    from supervisor.procs.pool import TemplateFailed

    verdict = _judge_a_crashing_campaign(monkeypatch, TemplateFailed("the worker template exited with status 1"), 0)
    assert verdict["outcome"] == "killed" and verdict["by"] == ["campaign-crashed:TemplateFailed"]


def test_the_work_directory_is_private(tmp_path: Path) -> None:
    from mutation.run import open_work

    open_work(tmp_path / "new" / ".mutation")
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    open_work(old)  # left open by an older run
    for folder in (tmp_path / "new", tmp_path / "new" / ".mutation", old):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert (old / ".gitignore").read_text() == "*\n"


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_run_stopped_by_sigterm_removes_its_campaigns_directory_and_workers(tmp_path: Path) -> None:
    """SIGTERM during the case map: the run exits 143 having stopped its campaign, so neither that
    campaign's directory nor any process it started is left."""
    import time

    import psutil
    from procutil import stop_tree

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    proc = subprocess.Popen([sys.executable, "-m", "mutation", "run", "--group", "interrupt", "--scenario",
                             "single-tool", "--module", "hermes/outcomes.py", "--work", str(tmp_path / "work")],
                            cwd=REPO, env=env, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while not any(scratch.glob("hermes-mutation-*/*")):  # a case of the map's campaign is under way
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the case map never started a case"
            time.sleep(0.05)  # polling for the directory, not waiting out a guess
        started = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        stop_tree(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert list(scratch.iterdir()) == [], out[-3000:]
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        p.kill()
    assert alive == []
