"""The systems a campaign can crash-test: one `Target` per system under test, registered by name.

A target says what it promises (which decides a violation's class: breaking a rule that
rests on a promise the target never made is a CONTRACT finding, anything else is DAMAGE,
see supervisor.chaos.checker) and which of its own documents say what of each finding (a
violation is a broken promise, documented behaviour, or beyond what the target ever claimed:
supervisor.chaos.checker.promises), what must be installed for it, whether the warm fork-server
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

# What a violation is about beyond its invariant (derived by supervisor.chaos.checker.promises):
# the second half of the (invariant, condition) keys below. ANY: every condition of the invariant.
ANY = "*"
REQUEST_NOT_DURABLE = "request-not-durable"    # durable-before-effect: no durable row asked for the call
                                               # (whether or not its dispatch intent was there)
INTENT_NOT_DURABLE = "intent-not-durable"      # durable-before-effect: only the dispatch intent was missing
RAN_UNDISPATCHED = "ran-undispatched"          # effect-semantics: ran more often than durably dispatched
RERUN = "rerun"                                # effect-semantics: a call ran (or a write was applied) more
                                               # than its policy allows, after its worker was killed
RERUN_AFTER_CHECKPOINT_KILL = "rerun-after-checkpoint-kill"  # ... killed inside the save of the next
                                               # checkpoint after the call ran (LangGraph's put(), issue #8039)
EFFECT_MISMATCH = "effect-mismatch"            # effect-semantics: any other (a result of a run that never
                                               # was, a cancelled call that ran, an outcome dropped, a write lost)


@dataclass(frozen=True)
class Promises:
    """What a target promises beyond a durable transcript. A violation of a rule that rests on
    a promise the target does not make is classed CONTRACT, not DAMAGE.

    Apart from the class, what the target's own documents say of each violation, keyed by
    (invariant, condition) (condition: one of the names above, or ANY): `promised` names the
    document saying it cannot happen (the violation is a broken promise), `documented` the one
    saying it can (documented behaviour); anything else is this project's contract, which the
    target never claimed (beyond promise), resting on `claims`, the document of what it does
    claim. `contract` set means the target promises this project's whole contract, on that
    document: every violation is then a broken promise (ours).
    """

    dispatch_intents: bool = True     # a durable intent precedes every tool run
    durable_requests: bool = True     # the assistant's tool-call row is durable before its tools run
    stream_retraction: bool = True    # streamed text ends committed or explicitly retracted
    durable_projections: bool = True  # nothing is shown before it is durable
    promised: Mapping[tuple[str, str], str] = field(default_factory=dict)
    documented: Mapping[tuple[str, str], str] = field(default_factory=dict)
    claims: str = ""
    contract: str = ""


OUR_CONTRACT = "this project's docs/contract.md, The durability contract (each invariant: docs/chaos.md, The verdict)"
FULL_PROMISES = Promises(contract=OUR_CONTRACT)

# The documents the other targets' labels rest on (facts from them, in our words).
_HERMES_DOCS = "https://hermes-agent.nousresearch.com/docs"
HERMES_AGENT_SESSIONS = (f"{_HERMES_DOCS}/user-guide/sessions: every conversation is saved in state.db with its "
                         "full message history (tool calls and results included)")
HERMES_AGENT_CLAIMS = (f"{_HERMES_DOCS}/user-guide/sessions and /developer-guide/session-storage: what state.db "
                       "keeps (sessions, messages, search indexes; no dispatch record), nothing on when a row is "
                       "written relative to a tool run or to what is shown, nor on what a killed turn leaves")
_OA_SESSIONS = "https://openai.github.io/openai-agents-python/sessions/"
OA_STORED_AFTER_RUN = (f"{_OA_SESSIONS}#core-session-behavior: a run's new items (tool calls and outputs "
                       "included) are stored after the run, so they run and are streamed before they are stored")
OA_HISTORY = f"{_OA_SESSIONS}#core-session-behavior: the stored items are the history every later run starts from"
OA_CLAIMS = (f"{_OA_SESSIONS}: what a session stores and when; nothing records a tool call before it runs, "
             "resuming is for a run paused for approval (not one killed mid-way), streamed events are never "
             "retracted")
_LG_DURABLE = "https://docs.langchain.com/oss/python/langgraph/durable-execution"
_LG_PERSISTENCE = "https://docs.langchain.com/oss/python/langgraph/persistence"
LG_RESUME = f"{_LG_DURABLE}: an interrupted run resumes from its last recorded state"
LG_SYNC = f"{_LG_DURABLE}#sync: under durability \"sync\" every checkpoint is written before the next step starts"
LG_ASYNC = (f"{_LG_DURABLE}#async: under durability \"async\" a checkpoint is written while the next step runs, "
            "and may be missing if the process crashes")
LG_EXIT = (f"{_LG_DURABLE}#exit: under durability \"exit\" nothing is written until the run ends, so a failure "
           "mid-run cannot be recovered")
LG_NODE_RERUN = (f"{_LG_DURABLE}#starting-points-for-resuming-workflows: a StateGraph resumes at the start of the "
                 "node where execution stopped, so that node's side effects run again")
LG_PENDING_WRITES = (f"{_LG_PERSISTENCE}#pending-writes: a node that completed keeps its writes, so a resume "
                     "does not run it again; https://github.com/langchain-ai/langgraph/issues/8039 (labelled bug): "
                     "under \"sync\" a kill inside the next checkpoint's save can still lose them and rerun the node")
LG_CLAIMS = (f"{_LG_PERSISTENCE}: a checkpoint per step and a node's writes once it returns; nothing records a "
             "tool call before it runs, nothing retracts streamed output")


def _langgraph(durability: str, mode_doc: str) -> Promises:
    """What LangGraph promises under one durability mode: only "sync" saves the model's tool-call
    message before the tools node starts; a node stopped mid-way runs again in every mode."""
    sync = durability == "sync"
    promised = {("no-lost-rows", ANY): LG_RESUME}
    documented = {("effect-semantics", RERUN): LG_NODE_RERUN}
    if sync:
        promised |= {("durable-before-effect", REQUEST_NOT_DURABLE): mode_doc,
                     ("effect-semantics", RERUN_AFTER_CHECKPOINT_KILL): LG_PENDING_WRITES}
    else:
        documented |= {("durable-before-effect", REQUEST_NOT_DURABLE): mode_doc,
                       ("durable-before-visible", ANY): mode_doc,
                       ("effect-semantics", RERUN_AFTER_CHECKPOINT_KILL): mode_doc}
    return Promises(dispatch_intents=False, durable_requests=sync, stream_retraction=False,
                    durable_projections=False, promised=promised, documented=documented, claims=LG_CLAIMS)


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
           Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False,
                    promised={("no-lost-rows", ANY): HERMES_AGENT_SESSIONS}, claims=HERMES_AGENT_CLAIMS),
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
                    durable_projections=False, promised={("no-lost-rows", ANY): OA_HISTORY},
                    documented={("durable-before-effect", REQUEST_NOT_DURABLE): OA_STORED_AFTER_RUN,
                                ("durable-before-visible", ANY): OA_STORED_AFTER_RUN},
                    claims=OA_CLAIMS),
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
           _langgraph("sync", LG_SYNC), langgraph_schema, forkserver=True,
           preload=("worker.targets.langgraph", "worker.targets.langgraph_graph", "worker.targets.langgraph_model"),
           modules=("langgraph", "langgraph.checkpoint.sqlite"),
           extra="langgraph", package="langgraph>=1.2.24,<1.3",
           install_hint=("the langgraph target needs LangGraph: pip install 'hermes-supervisor[langgraph]' "
                         "(installs langgraph, langgraph-checkpoint-sqlite and langchain-core)"),
           promises_with={("--durability", mode): _langgraph(mode, doc)
                          for mode, doc in (("async", LG_ASYNC), ("exit", LG_EXIT))}),
)}
DEFAULT_TARGET = "hermes"


def schema_of(conn: sqlite3.Connection) -> SchemaReader:
    """The reader of the first target whose schema the database is in; ours when none says so
    (a file with no tables yet reads as ours: empty)."""
    return next((t.schema for t in TARGETS.values() if t.schema.recognizes(conn)), TARGETS[DEFAULT_TARGET].schema)

