"""The langgraph target: run or resume one turn with a LangGraph `StateGraph` inside the worker.

`python -m worker run|resume --target langgraph [--target-option durability=exit|async|sync] ...` runs
the turn with LangGraph instead of our runtime: an agent node (the scripted model through
`worker.targets.langgraph_model`) and LangGraph's prebuilt `ToolNode` (the chaos tools, the
same effects ledger and effect reports as every target), over `MessagesState`, compiled
with a `SqliteSaver` subclass on ``--db`` (`worker.targets.langgraph_graph`). The session
is the graph's ``thread_id``. The option ``durability`` is LangGraph's own: ``exit`` (save only when
the run ends), ``async`` (LangGraph's default: save each step in the background while the
next runs) or ``sync`` (wait for each step's checkpoint before the next step; this
target's default, the mode a user who cares about durability picks).

Turn ids. The runner names turns ``turn-0``, ``turn-1``...; the id is stored durably in the
turn's `HumanMessage` (``additional_kwargs[TURN_KEY]``), and every message after it until
the next user message belongs to that turn (the supervisor's reader,
`supervisor.chaos.schema.langgraph`, maps rows the same way).

Probes. Of our kill points (hermes.probes.POINTS):

- `turn.start`: the user message is built in memory, before `graph.stream(input)`;
- `model.request` / `model.response` around each model call; `model.chunk` after each
  streamed chunk, only with ``--stream`` (the streamed-answer scenario);
- `flush.begin` / `flush.in_txn` / `flush.committed` around and inside each
  `SqliteSaver.put` (a checkpoint) and `put_writes` (one task's pending writes). LangGraph
  calls them on its background threads, so a flush probe's hit count (``flush.begin:3``)
  names whichever save reached it third: under ``sync`` and ``async`` a task's writes and
  the next checkpoint are saved concurrently, in no fixed order (langgraph issue #8039),
  and a case may kill a different save than its baseline's third. Under ``exit`` there is
  no save until the run ends, so a turn has a single burst of flushes at its end;
- `callback.interim.*` around the interim projection (an agent update with text and tool
  calls), `callback.tool_complete.*` around each tool result projection (a tools update),
  both taken from ``graph.stream(..., stream_mode="updates")``: LangGraph emits a node's
  update when the node returns, while its writes are saved in the background, so neither
  is durable first by construction;
- `tool.dispatch.before` / `.after` around each call (ToolNode's `wrap_tool_call`). A
  ToolNode runs one step's calls on a thread pool, concurrently;
- `finalize.before` when the stream yields the final answer (LangGraph still has that
  step's save ahead of it), `finalize.after` once `graph.stream` has returned (LangGraph has
  then waited for every save of the run, in every durability mode);
- `resume.begin` before the durable state is read, `resume.reconciled` once the resume is
  decided (action ``continue`` with the pending nodes).

The record's `unreachable` lists what LangGraph cannot reach (`hermes-supervisor chaos
--list-points --target langgraph` shows it).

Resume is what LangGraph documents: when the thread's latest checkpoint has a step still
open (tasks, pending ``next`` nodes among them), ``graph.stream(None, config)`` on the same
thread finishes it; a task whose writes were saved on that checkpoint is not run again (its
writes are replayed), any other is. A turn whose user message never became durable (under
``exit``, nothing of a killed run is) is not in the thread at all: ``run`` sends the message
again as a new input.

List content (``--message-format json``): a langchain-core `HumanMessage` takes a list of content
parts as its content (``str | list[str | dict]``) and keeps it as given; the checkpointer saves
and restores it as given, and this target's model (`langgraph_model.to_openai`) sends a human
message's content unchanged. So a list is passed through (`content_parts_refusal`).

Options of our runtime that LangGraph has no counterpart for are not applied here:
``--synchronous`` and ``--busy-budget`` (the saver's connection keeps SQLite's defaults, as
`SqliteSaver.from_conn_string` does), ``--compact-above`` and ``--max-model-calls``.
"""
from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hermes import persistence_failure, probes
from hermes.extras import install_line
from hermes.turn import PERSISTENCE_FAILED
from targetkit import ANY, REQUEST_NOT_DURABLE, RERUN, RERUN_AFTER_CHECKPOINT_KILL, Promises, Target, TargetOption
from worker.targets import Report, UsageError, open_ledger, show, toolsets_of, user_app_tools

log = logging.getLogger("worker.targets.langgraph")

NAME = "langgraph"
DURABILITY_MODES = ("exit", "async", "sync")
DEFAULT_DURABILITY = "sync"
TURN_KEY = "hermes_turn_id"  # HumanMessage.additional_kwargs key holding the runner's turn id

# The documents its labels rest on (facts from them, in our words).
_DURABLE = "https://docs.langchain.com/oss/python/langgraph/durable-execution"
_PERSISTENCE = "https://docs.langchain.com/oss/python/langgraph/persistence"
RESUME_DOC = f"{_DURABLE}: an interrupted run resumes from its last recorded state"
MODE_DOCS = {
    "sync": f"{_DURABLE}#sync: under durability \"sync\" every checkpoint is written before the next step starts",
    "async": (f"{_DURABLE}#async: under durability \"async\" a checkpoint is written while the next step runs, "
              "and may be missing if the process crashes"),
    "exit": (f"{_DURABLE}#exit: under durability \"exit\" nothing is written until the run ends, so a failure "
             "mid-run cannot be recovered"),
}
NODE_RERUN_DOC = (f"{_DURABLE}#starting-points-for-resuming-workflows: a StateGraph resumes at the start of the "
                  "node where execution stopped, so that node's side effects run again")
PENDING_WRITES_DOC = (f"{_PERSISTENCE}#pending-writes: a node that completed keeps its writes, so a resume "
                      "does not run it again; https://github.com/langchain-ai/langgraph/issues/8039 (labelled bug): "
                      "under \"sync\" a kill inside the next checkpoint's save can still lose them and rerun the node")
CLAIMS_DOC = (f"{_PERSISTENCE}: a checkpoint per step and a node's writes once it returns; nothing records a "
              "tool call before it runs, nothing retracts streamed output")


def promises(options: Mapping[str, str]) -> Promises:
    """What LangGraph promises under a durability mode. It records no dispatch intents (a node's
    effects are recorded only by the writes it returns, after it ran), emits a node's stream update
    when the node returns while its writes are saved in the background, and has no retraction of
    streamed text: findings on those promises are CONTRACT, not DAMAGE. Only "sync" saves the
    model's tool-call message before the tools node starts; a node stopped mid-way runs again in
    every mode."""
    durability = options["durability"]
    mode_doc = MODE_DOCS[durability]
    sync = durability == "sync"
    promised = {("no-lost-rows", ANY): RESUME_DOC}
    documented = {("effect-semantics", RERUN): NODE_RERUN_DOC}
    if sync:
        promised |= {("durable-before-effect", REQUEST_NOT_DURABLE): mode_doc,
                     ("effect-semantics", RERUN_AFTER_CHECKPOINT_KILL): PENDING_WRITES_DOC}
    else:
        documented |= {("durable-before-effect", REQUEST_NOT_DURABLE): mode_doc,
                       ("durable-before-visible", ANY): mode_doc,
                       ("effect-semantics", RERUN_AFTER_CHECKPOINT_KILL): mode_doc}
    return Promises(dispatch_intents=False, durable_requests=sync, stream_retraction=False,
                    durable_projections=False, promised=promised, documented=documented, claims=CLAIMS_DOC)


OPTIONS = {"durability": TargetOption(DURABILITY_MODES, DEFAULT_DURABILITY,
                                      "LangGraph's durability mode: when a step's checkpoint is saved"),
           # Your own graph instead of this target's (worker.targets.langgraph_app).
           "app": TargetOption.import_path("your graph: the function that, given a checkpointer, returns it "
                                           "compiled (or a StateGraph); its ToolNode tools are the campaign's"),
           "policies": TargetOption.tool_policies("with app: each tool's effect policy (undeclared: at_most_once)")}

# Its workers start as forks of the warm template, which imports LangGraph before its first fork.
TARGET = Target(
    NAME, "a LangGraph StateGraph (the `langgraph` extra)", adapter=__name__,
    schema="supervisor.chaos.schema.langgraph", promises=promises({"durability": DEFAULT_DURABILITY}),
    options=OPTIONS, promises_with=promises,
    unreachable={"compact.in_txn": "LangGraph has no compaction: a checkpoint holds the whole message list, and "
                                   "this graph trims nothing"},
    unsupported={"compaction": "LangGraph has no compaction: --compact-above has no counterpart",
                 "compaction-mid-turn": "LangGraph has no compaction"},
    forkserver=True, preload=(__name__, "worker.targets.langgraph_graph", "worker.targets.langgraph_model",
                              "worker.targets.langgraph_app:warm"),
    modules=("langgraph", "langgraph.checkpoint.sqlite"),  # langchain-core comes with langgraph
    extra="langgraph", package="langgraph>=1.2.24,<1.3", app_tools=f"{__name__}:app_tools",
    install_hint=("the langgraph target needs LangGraph (langgraph, langgraph-checkpoint-sqlite and langchain-core, "
                  f"the `langgraph` extra): {install_line('langgraph')}"))


def app_tools(options: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """With ``app``: the tools of the user's graph (worker.targets.langgraph_app.declared); else None."""
    return user_app_tools(options, "app", "graph", "worker.targets.langgraph_app:declared")


def content_parts_refusal(parts: list[dict[str, Any]]) -> str | None:
    """None: a HumanMessage holds the list as its content, and the model is sent it as given."""
    del parts
    return None


@dataclass
class TurnView:
    """One turn as the thread's messages show it."""

    id: str
    text: Any
    final: str | None = None  # the final answer's text, once there is one

    @property
    def answered(self) -> bool:
        return self.final is not None


def turns_of(messages: Sequence[Any]) -> list[TurnView]:
    """The turns of a thread's messages (langchain-core messages), in order: a user message
    starts one (its id from ``additional_kwargs[TURN_KEY]``, else ``turn-<k>``)."""
    from worker.targets.langgraph_model import content_text

    turns: list[TurnView] = []
    for message in messages:
        if message.type == "human":
            turns.append(TurnView(str(message.additional_kwargs.get(TURN_KEY) or f"turn-{len(turns)}"),
                                  message.content))
        elif message.type == "ai" and turns and not message.tool_calls and content_text(message.content).strip():
            turns[-1].final = content_text(message.content)
    return turns


def _messages_in(update: Any) -> list[Any]:
    """The messages a node's update carries (a list, or one message)."""
    if not isinstance(update, dict):
        return []
    value = update.get("messages")
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _connect(db: Path, command: str) -> sqlite3.Connection:
    """The saver's connection; a file that is SQLite but holds another schema is refused."""
    conn = sqlite3.connect(str(db), check_same_thread=False)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        conn.close()
        if "not a database" in str(exc):
            raise UsageError(f"--db {db} is not a SQLite database") from None
        raise
    if tables and "checkpoints" not in tables:
        conn.close()
        raise UsageError(f"--db {db} is a database of another schema, not a LangGraph checkpoint database")
    if command == "resume" and not tables:
        conn.close()
        raise UsageError(f"--db {db} holds no LangGraph checkpoints; there is nothing to resume")
    return conn


def _failure(exc: BaseException, db: Path) -> tuple[str, str]:
    """(failure_reason, error) for an exception that ended the turn."""
    from worker.targets.langgraph_model import ModelError

    if isinstance(exc, sqlite3.Error):
        cause = persistence_failure.classify(exc, db)
        return f"{PERSISTENCE_FAILED}:{cause}", persistence_failure.describe(cause, str(exc), db)
    if isinstance(exc, ModelError):
        return f"model_error:{exc.kind}", f"The model call failed: {exc}"
    import openai

    kinds = ((openai.APITimeoutError, "timeout"), (openai.APIConnectionError, "connection"),
             (openai.APIStatusError, "http"), (openai.APIResponseValidationError, "bad_response"))
    for kind, name in kinds:
        if isinstance(exc, kind):
            return f"model_error:{name}", f"The model call failed: {type(exc).__name__}: {exc}"
    return f"graph_error:{type(exc).__name__}", f"LangGraph stopped the turn: {type(exc).__name__}: {exc}"


class LangGraphTarget:
    """One worker's graph on one thread (the session)."""

    def __init__(self, args: Any, project: Callable[..., None]) -> None:
        from worker.targets.langgraph_graph import ProbedSqliteSaver, build_graph
        from worker.targets.langgraph_model import ScriptedChatModel

        self.args = args
        self.project = project  # project(kind, turn=..., **fields): the UI event, acknowledged by the supervisor
        self.durability = (getattr(args, "target_options", None) or {}).get("durability", DEFAULT_DURABILITY)
        self.turn_id: str | None = None
        self.conn = _connect(Path(args.db), args.command)
        self.saver = ProbedSqliteSaver(self.conn, self._context)
        self.model = ScriptedChatModel(base_url=args.base_url, model=args.model,
                                       api_key=args.api_key or "scripted", timeout=args.timeout,
                                       max_retries=args.max_retries, streaming=bool(args.stream),
                                       system_prompt=args.system_prompt).wire(self._context)
        self.graph = build_graph(self.model, toolsets_of(args), self.saver, self._context)
        self.config = {"configurable": {"thread_id": args.session}}

    def _context(self) -> dict[str, Any]:
        return {"session": self.args.session, "turn": self.turn_id}

    # ------------------------------------------------------------ durable state
    def _state(self) -> Any:
        return self.graph.get_state(self.config)

    def _pending_input(self) -> list[Any]:
        """Messages of a run's input that LangGraph saved and has not applied yet: the input
        checkpoint holds them in its ``__start__`` channel until the first step runs."""
        saved = self.saver.get_tuple(self.config)
        start = saved.checkpoint["channel_values"].get("__start__") if saved is not None else None
        return _messages_in(start)

    def _turns(self) -> list[TurnView]:
        """The thread's turns as LangGraph's live state shows them: the latest checkpoint with the
        saved writes of its finished tasks applied, plus a saved input not applied yet."""
        state = self._state()
        pending = self._pending_input() if "__start__" in state.next else []
        return turns_of([*state.values.get("messages", []), *pending])

    def _unfinished(self, state: Any) -> bool:
        """Is the latest checkpoint's step still open (and none of its tasks failed)?

        Not `state.next`: LangGraph's live state leaves out of ``next`` a task whose writes are
        saved, so a step whose every task finished but whose checkpoint was never saved shows
        ``next == ()`` while its tasks are still there to replay (a resume applies their writes
        and goes on). A finished run's last checkpoint has no task.
        """
        return bool(state.tasks) and not any(getattr(t, "error", None) for t in state.tasks)

    # ------------------------------------------------------------------ running
    def _show(self, message: Any) -> None:
        from worker.targets.langgraph_model import content_text

        ctx = self._context()
        if message.type == "ai":
            text = content_text(message.content)
            if message.tool_calls and text.strip():
                probes.fire("callback.interim.before", **ctx)
                self.project("interim", turn=self.turn_id, text=text)
                probes.fire("callback.interim.after", **ctx)
            elif not message.tool_calls and text.strip():  # the answer: LangGraph has its step's save ahead
                probes.fire("finalize.before", **ctx)
        elif message.type == "tool":
            ids = dict(ctx, tool_call_id=message.tool_call_id)
            probes.fire("callback.tool_complete.before", **ids)
            self.project("tool_complete", turn=self.turn_id, tool_call_id=message.tool_call_id,
                         tool=message.name, content=content_text(message.content))
            probes.fire("callback.tool_complete.after", **ids)

    def _drive(self, payload: Any) -> None:
        """Stream the graph to its end, projecting each node's update as it comes."""
        for update in self.graph.stream(payload, self.config, stream_mode="updates", durability=self.durability):
            for node_update in (update.values() if isinstance(update, dict) else ()):
                for message in _messages_in(node_update):
                    self._show(message)
        probes.fire("finalize.after", **self._context())

    def _outcome(self, turn_id: str, exc: BaseException | None = None, **extra: Any) -> dict[str, Any]:
        view = next((t for t in self._turns() if t.id == turn_id), None) if exc is None else None
        completed = view is not None and view.answered
        out = {"outcome": "completed" if completed else "failed", "session": self.args.session,
               "turn_id": turn_id, "final_response": view.final if view else None,
               "turn_exit_reason": "final_answer" if completed else "failed", "api_calls": self.model.calls,
               "target": NAME, "durability": self.durability, **extra}
        if not completed:
            reason, error = (_failure(exc, Path(self.args.db)) if exc is not None
                             else ("graph_ended_without_answer", "the graph ended without a final answer"))
            out.update(failure_reason=reason, error=error)
        return out

    def _run_graph(self, payload: Any, turn_id: str, **extra: Any) -> dict[str, Any]:
        self.turn_id = turn_id
        try:
            self._drive(payload)
        except Exception as exc:  # the turn ends failed, its reason recorded (LangGraph saved the error)
            log.warning("turn %s failed: %s: %s", turn_id, type(exc).__name__, exc)
            return self._outcome(turn_id, exc, **extra)
        return self._outcome(turn_id, **extra)

    def resume(self) -> dict[str, Any]:
        """Finish the thread's interrupted run the way LangGraph documents: stream(None) on its thread."""
        probes.fire("resume.begin", session=self.args.session)
        state = self._state()
        if not self._unfinished(state):
            return {"outcome": "nothing to resume", "target": NAME, "durability": self.durability}
        turns = self._turns()
        turn_id = turns[-1].id if turns else "turn-0"
        self.turn_id = turn_id
        probes.fire("resume.reconciled", session=self.args.session, turn=turn_id, action="continue",
                    next=list(state.next), replayed=[t.name for t in state.tasks if t.name not in state.next])
        return self._run_graph(None, turn_id)

    def run(self) -> dict[str, Any]:
        """Finish an interrupted run first; then run the message as the wanted turn, unless it already ran."""
        from langchain_core.messages import HumanMessage

        if self.saver.get_tuple(self.config) is not None and self._unfinished(self._state()):
            resumed = self.resume()
            if resumed.get("outcome") == "failed":
                resumed["note"] = "the interrupted turn could not be finished; the new message was not run"
                return resumed
        turns = self._turns() if self.saver.get_tuple(self.config) is not None else []
        wanted = self.args.turn_id or f"turn-{len(turns)}"
        done = next((t for t in turns if t.id == wanted), None)
        if done is not None:  # already in the thread: a no-op, never a second copy of its question
            out = self._outcome(wanted)
            if done.answered:
                out["turn_exit_reason"] = "already_finished"
            return out
        message = HumanMessage(content=self.args.message, additional_kwargs={TURN_KEY: wanted})
        self.turn_id = wanted
        probes.fire("turn.start", **self._context())
        return self._run_graph({"messages": [message]}, wanted)

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:
            pass


def _storage_failure(args: Any, exc: sqlite3.Error) -> dict[str, Any]:
    reason, error = _failure(exc, Path(args.db))
    return {"outcome": "failed", "session": args.session, "turn_id": getattr(args, "turn_id", None),
            "final_response": None, "turn_exit_reason": PERSISTENCE_FAILED, "failure_reason": reason,
            "error": error, "target": NAME}


def execute(args: Any, link: Any, report: Report) -> int:
    """Run or resume one turn with LangGraph (this target's graph, or the user's: option ``app``), then
    report its outcome."""
    project = lambda kind, turn=None, **fields: show(link, args.session, turn, kind, **fields)  # noqa: E731
    app = (getattr(args, "target_options", None) or {}).get("app")
    ledger = None
    try:
        if app:
            from worker.targets.langgraph_app import AppUnusable, open_app

            try:
                target, ledger = open_app(args, link, project)
            except (AppUnusable, ValueError) as exc:
                raise UsageError(str(exc)) from None
        else:
            ledger = open_ledger(args, link)
            target = LangGraphTarget(args, project)
    except sqlite3.Error as exc:  # storage that fails at open: the named persistence failure
        if ledger is not None:
            ledger.close()
        return report(_storage_failure(args, exc))
    try:
        try:
            out = target.resume() if args.command == "resume" else target.run()
        except sqlite3.Error as exc:  # reading the thread's state failed (the graph run reports its own)
            out = _storage_failure(args, exc)
        finally:
            target.close()
    finally:
        ledger.close()
    return report(out)
