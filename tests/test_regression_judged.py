"""A regression file written by `--regression-out` passes only on a case the checker judged.

The emitted test is executed as written, with its replay stubbed by finished cases, so what it
asserts is checked without running workers: a case whose verdict is neither True nor False (a
harness error, a lost ledger) or whose invariant was not itself judged fails it, like a kill
that no longer lands or a violation of its invariant.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import pytest

from supervisor.chaos.checker import (
    NO_LEDGER,
    UNDETERMINED,
    Verdict,
    Violation,
    compose,
    unknown_verdict,
)
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.conversation import Conversation, TurnPlan
from supervisor.chaos.generator import Case
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.regression import failure, regression_text
from supervisor.chaos.runner import CaseResult

INVARIANT = "effect-semantics"
FAULT = "probe:self@tool.dispatch.before:1@t0p0"
CONVERSATION = Conversation((TurnPlan("look it up"),))


def _emitted(result: CaseResult) -> Callable[[], None]:
    """The test function of the file `--regression-out` writes, its replay giving `result`."""
    text = regression_text(invariant=INVARIANT, origin="gen-0123456789ab/x", conversation=CONVERSATION,
                           fault=Fault.parse(FAULT), config=CampaignConfig(scenarios=[]), function="test_it")
    namespace: dict[str, Any] = {}
    exec(compile(text, "test_emitted.py", "exec"), namespace)  # noqa: S102 - the file as written
    namespace["replay"] = lambda *args, **kwargs: result
    return namespace["test_it"]


def _result(*parts: Verdict, kills: int = 1) -> CaseResult:
    return CaseResult(Case(CONVERSATION.name, Fault.parse(FAULT)), compose(list(parts), "case"), kills, kills, 0.1)


HELD = Verdict(True, [], {}, INVARIANT)
LANDED = Verdict(True, [], {"kills": 1}, "coverage")


def test_a_judged_case_whose_invariant_held_passes() -> None:
    result = _result(HELD, LANDED)
    assert failure(result, INVARIANT, FAULT) is None
    _emitted(result)()
    # A campaign keeps a pass without its parts: True is every invariant judged and held.
    slim = _result(HELD, LANDED)
    slim.verdict = Verdict(True, [], {}, "case")
    _emitted(slim)()
    # Another invariant's violation is another regression's business: this one was judged and held.
    other = _result(HELD, LANDED, Verdict(False, [Violation("well-formed", "an orphan result")], {}, "well-formed"))
    _emitted(other)()


@pytest.mark.parametrize("parts, why", [
    # The observer failed: nothing the checker concluded can be trusted.
    ((HELD, LANDED, unknown_verdict("harness", "the observer failed", UNDETERMINED)), "not judged (undetermined)"),
    # The ledger was lost: the invariant itself could not be judged, though another failed.
    ((unknown_verdict(INVARIANT, "no effects ledger", NO_LEDGER), LANDED,
      Verdict(False, [Violation("well-formed", "an orphan result")], {}, "well-formed")), f"{INVARIANT} was not judged"),
    ((Verdict(False, [Violation(INVARIANT, "ran twice")], {}, INVARIANT), LANDED), f"{INVARIANT} does not hold"),
    ((HELD, unknown_verdict("coverage", "no-kill: ...", "no-kill")), "did not land"),
])
def test_a_case_not_judged_or_not_held_fails_its_regression(parts: tuple[Verdict, ...], why: str) -> None:
    result = _result(*parts, kills=0 if why == "did not land" else 1)
    assert why in str(failure(result, INVARIANT, FAULT))
    with pytest.raises(AssertionError, match=re.escape(why)):
        _emitted(result)()
