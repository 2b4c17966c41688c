"""CI runs a fixed sample of each long sweep; `scripts/test --nightly` and the nightly workflow run all."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from sampling import sample

REPO = Path(__file__).resolve().parents[1]


def test_a_sample_marks_what_ci_leaves_to_the_night() -> None:
    params = sample(["a", "b", ("c", 1)], ["b"], ids=str)
    marked = {p.id: [m.name for m in p.marks] for p in params}
    assert marked == {"a": ["nightly"], "b": [], "('c', 1)": ["nightly"]}
    assert params[2].values == ("c", 1)
    with pytest.raises(ValueError, match="does not have"):
        sample(["a"], ["z"])


def test_ci_leaves_out_the_nightly_tests_and_the_nightly_workflow_runs_them() -> None:
    script = (REPO / "scripts" / "test").read_text()
    selections = re.findall(r'-m "([^"]*)"', script)  # the marker-selected runs: upstream, and all the rest
    assert len(selections) == 2 and all(s.endswith(" $long") for s in selections), selections
    assert 'long="and not nightly"' in script and '"${1:-}" = "--nightly"' in script
    assert './scripts/test "$@"' in (REPO / ".ci" / "run").read_text()
    flow = yaml.safe_load((REPO / ".github" / "workflows" / "chaos-nightly.yml").read_text())
    steps = [step.get("run", "") for step in flow["jobs"]["long-tests"]["steps"]]
    assert any(s.strip() == "bash .ci/run --nightly" for s in steps), steps
