"""The systems a campaign can crash-test: one `Target` per system under test, registered by name.

A target says what it promises (which decides a violation's class: breaking a rule that
rests on a promise the target never made is a CONTRACT finding, anything else is DAMAGE,
see supervisor.chaos.checker), what must be installed for it, whether the warm fork-server
template can start its workers and what that template imports for them before its first
fork, and which schema reader turns its durable store into the checker's model. Nothing
else in the harness knows which target it runs: a new target is an adapter on the worker
side (`python -m worker run|resume --target NAME`) and one entry here.
"""
from __future__ import annotations

import importlib.util
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from supervisor.chaos.schema import SchemaReader
from supervisor.chaos.schema import hermes as hermes_schema
from supervisor.chaos.schema import hermes_agent as hermes_agent_schema
from supervisor.chaos.schema import langgraph as langgraph_schema
from supervisor.chaos.schema import openai_agents as openai_agents_schema


@dataclass(frozen=True)
class Promises:
    """What a target promises beyond a durable transcript. A violation of a rule that rests on
    a promise the target does not make is classed CONTRACT, not DAMAGE."""

    dispatch_intents: bool = True     # a durable intent precedes every tool run
    durable_requests: bool = True     # the assistant's tool-call row is durable before its tools run
    stream_retraction: bool = True    # streamed text ends committed or explicitly retracted
    durable_projections: bool = True  # nothing is shown before it is durable


FULL_PROMISES = Promises()


@dataclass(frozen=True)
class Target:
    name: str                        # what `--target` takes, on both the supervisor and the worker side
    description: str                 # how `--target`'s help names it
    promises: Promises
    schema: SchemaReader             # reads its durable store (supervisor.chaos.schema)
    forkserver: bool = False         # its workers may start as forks of the warm template (worker.forkserver)
    # What that template imports before its first fork, besides our runtime: `MODULE` or
    # `MODULE:FUNCTION` (imported, then FUNCTION called), passed as `--preload` (worker.forkserver).
    preload: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()    # importable modules it needs (looked up, never imported)
    extra: str | None = None         # this project's pip extra that installs it
    package: str | None = None       # the distribution that extra installs
    install_hint: str = ""           # one line saying how to get it
    # Promises that differ with the target's options (the worker arguments a campaign adds, such as
    # LangGraph's `--durability async`); any other options make the `promises` above.
    promises_with: Mapping[tuple[str, ...], Promises] = field(default_factory=dict)

    def promises_for(self, target_args: Sequence[str] = ()) -> Promises:
        return self.promises_with.get(tuple(target_args), self.promises)

    def available(self) -> bool:
        """Is everything it needs installed? Found without importing it."""
        return all(importlib.util.find_spec(name) is not None for name in self.modules)

    def turn_state(self, conn: sqlite3.Connection, session: str, turn_id: str) -> str | None:
        return self.schema.turn_state(conn, session, turn_id)


_UPSTREAM = "hermes-agent==0.19.0"

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("hermes", "ours (default)", FULL_PROMISES, hermes_schema, forkserver=True),
    # Upstream hermes-agent records no dispatch intents, shows results before its flush commits
    # them, and streams without ever retracting: findings there are CONTRACT, not DAMAGE.
    # Its template imports upstream against a neutral home; each worker then sets its own
    # (worker.targets.hermes_agent: preload, prepare_home).
    Target("hermes-agent", "upstream hermes-agent (pip install 'hermes-supervisor[upstream]')",
           Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False),
           hermes_agent_schema, forkserver=True, preload=("worker.targets.hermes_agent:preload",),
           modules=("run_agent", "hermes_state"), extra="upstream", package=_UPSTREAM,
           install_hint=(f"the hermes-agent target needs upstream Hermes: pip install 'hermes-supervisor[upstream]' "
                         f"(installs {_UPSTREAM}), or pip install {_UPSTREAM} next to this project")),
    # The OpenAI Agents SDK records no dispatch intents and saves a tool call only together with
    # its output, after the tool ran; it emits its stream events before the session write that
    # holds them, and never retracts streamed text: findings on those promises are CONTRACT, not
    # DAMAGE. What that costs on a kill (a tool run again) is DAMAGE under effect-semantics. Its
    # template imports the SDK (with tracing off, as the adapter's wiring sets it) before its first fork.
    Target("openai-agents", "the OpenAI Agents SDK (pip install 'hermes-supervisor[openai-agents]')",
           Promises(dispatch_intents=False, durable_requests=False, stream_retraction=False,
                    durable_projections=False),
           openai_agents_schema, forkserver=True,
           preload=("worker.targets.openai_agents", "worker.targets.openai_agents_wiring"),
           modules=("agents",), extra="openai-agents", package="openai-agents>=0.24,<0.25",
           install_hint=("the openai-agents target needs the OpenAI Agents SDK: pip install "
                         "'hermes-supervisor[openai-agents]' (installs openai-agents>=0.24,<0.25)")),
    # LangGraph records no dispatch intents (a node's effects are recorded only by the writes it
    # returns, after it ran), emits a node's stream update when the node returns while its writes
    # are saved in the background (under durability "exit" only when the run ends), and has no
    # retraction of streamed text: findings on those promises are CONTRACT, not DAMAGE. Under
    # durability "sync" (the default) a step's checkpoint is saved before the next step starts, so
    # the model's tool-call message is durable before the tool node runs; "async" saves it while the
    # tools already run and "exit" only when the run ends, promising no such thing. Its workers
    # start as forks of the warm template, which imports LangGraph before its first fork.
    Target("langgraph", "a LangGraph StateGraph (pip install 'hermes-supervisor[langgraph]')",
           Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False),
           langgraph_schema, forkserver=True,
           preload=("worker.targets.langgraph", "worker.targets.langgraph_graph", "worker.targets.langgraph_model"),
           modules=("langgraph", "langgraph.checkpoint.sqlite"),
           extra="langgraph", package="langgraph>=1.2.24,<1.3",
           install_hint=("the langgraph target needs LangGraph: pip install 'hermes-supervisor[langgraph]' "
                         "(installs langgraph, langgraph-checkpoint-sqlite and langchain-core)"),
           promises_with={("--durability", mode): Promises(dispatch_intents=False, durable_requests=False,
                                                           stream_retraction=False, durable_projections=False)
                          for mode in ("async", "exit")}),
)}
DEFAULT_TARGET = "hermes"


def schema_of(conn: sqlite3.Connection) -> SchemaReader:
    """The reader of the first target whose schema the database is in; ours when none says so
    (a file with no tables yet reads as ours: empty)."""
    return next((t.schema for t in TARGETS.values() if t.schema.recognizes(conn)), TARGETS[DEFAULT_TARGET].schema)

