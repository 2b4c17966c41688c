"""The systems a campaign can crash-test: one `Target` per system under test, registered by name.

A target says what it promises (which decides a violation's class: breaking a rule that
rests on a promise the target never made is a CONTRACT finding, anything else is DAMAGE,
see supervisor.chaos.checker), what must be installed for it, whether the warm fork-server
template can start its workers, and which schema reader turns its durable store into the
checker's model. Nothing else in the harness knows which target it runs: a new target is an
adapter on the worker side (`python -m worker run|resume --target NAME`) and one entry here.
"""
from __future__ import annotations

import importlib.util
import sqlite3
from dataclasses import dataclass

from supervisor.chaos.schema import SchemaReader
from supervisor.chaos.schema import hermes as hermes_schema
from supervisor.chaos.schema import hermes_agent as hermes_agent_schema
from supervisor.chaos.schema import openai_agents as openai_agents_schema


@dataclass(frozen=True)
class Promises:
    """What a target promises beyond a durable transcript. A violation of a rule that rests on
    a promise the target does not make is classed CONTRACT, not DAMAGE."""

    dispatch_intents: bool = True     # a durable intent precedes every tool run
    stream_retraction: bool = True    # streamed text ends committed or explicitly retracted
    durable_projections: bool = True  # nothing is shown before it is durable


FULL_PROMISES = Promises()


@dataclass(frozen=True)
class Target:
    name: str                        # what `--target` takes, on both the supervisor and the worker side
    description: str                 # how `--target`'s help names it
    promises: Promises
    schema: SchemaReader             # reads its durable store (supervisor.chaos.schema)
    forkserver: bool = False         # the warm template (worker.forkserver) preloads our runtime only
    modules: tuple[str, ...] = ()    # importable modules it needs (looked up, never imported)
    extra: str | None = None         # this project's pip extra that installs it
    package: str | None = None       # the distribution that extra installs
    install_hint: str = ""           # one line saying how to get it

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
    Target("hermes-agent", "upstream hermes-agent (pip install 'hermes-supervisor[upstream]')",
           Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False),
           hermes_agent_schema, modules=("run_agent", "hermes_state"), extra="upstream", package=_UPSTREAM,
           install_hint=(f"the hermes-agent target needs upstream Hermes: pip install 'hermes-supervisor[upstream]' "
                         f"(installs {_UPSTREAM}), or pip install {_UPSTREAM} next to this project")),
    # The OpenAI Agents SDK records no dispatch intents (it stores a tool call together with its
    # output, after the tool ran), emits its stream events before the session write that holds
    # them, and never retracts streamed text: findings on those promises are CONTRACT, not DAMAGE.
    Target("openai-agents", "the OpenAI Agents SDK (pip install 'hermes-supervisor[openai-agents]')",
           Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False),
           openai_agents_schema, modules=("agents",), extra="openai-agents", package="openai-agents>=0.24,<0.25",
           install_hint=("the openai-agents target needs the OpenAI Agents SDK: pip install "
                         "'hermes-supervisor[openai-agents]' (installs openai-agents>=0.24,<0.25)")),
)}
DEFAULT_TARGET = "hermes"


def schema_of(conn: sqlite3.Connection) -> SchemaReader:
    """The reader of the first target whose schema the database is in; ours when none says so
    (a file with no tables yet reads as ours: empty)."""
    return next((t.schema for t in TARGETS.values() if t.schema.recognizes(conn)), TARGETS[DEFAULT_TARGET].schema)

