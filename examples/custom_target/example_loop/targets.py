"""The two loops as hermes-supervisor targets (registered in ../pyproject.toml)."""
from targetkit import Promises, Target

# What the loops claim: every turn survives a crash whole, hermes-supervisor's contract.
CLAIM = "examples/custom_target/README.md: a turn survives a crash at any instant (hermes-supervisor's contract)"
NOT_HERE = {
    "model.chunk": "the loops never stream",
    "compact.in_txn": "the loops never compact a conversation",
    "callback.interim.before": "the loops show no text before the answer",
    "callback.interim.after": "the loops show no text before the answer",
}

NAIVE = Target("example-loop", "the example's naive loop (examples/custom_target)", adapter="example_loop.naive",
               schema="example_loop.store:READER", promises=Promises(contract=CLAIM), unreachable=NOT_HERE,
               preload=("example_loop.naive",),  # imported once by the warm template, not by each worker
               modules=("example_loop", "openai"),
               install_hint="pip install ./examples/custom_target (from a checkout of hermes-supervisor)")
FIXED = Target("example-loop-fixed", "the example's loop, fixed (examples/custom_target)",
               adapter="example_loop.fixed", schema="example_loop.store:READER", promises=Promises(contract=CLAIM),
               unreachable=NOT_HERE, preload=("example_loop.fixed",), modules=("example_loop", "openai"),
               install_hint=NAIVE.install_hint)
