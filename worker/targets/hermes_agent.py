"""The hermes-agent target: run a turn with upstream Hermes (PyPI `hermes-agent`) inside the worker.

`python -m worker run|resume --target hermes-agent ...` uses this module instead of our
runtime. Nothing of upstream is edited; everything is wrapped at run time, on the objects
this module creates (the agent, its `SessionDB`) or in `run_agent`'s namespace:

- upstream's `AIAgent` talks to the scripted model server (`--base-url`), writes its own
  `state.db` schema to `--db` (upstream's `SessionDB`), and gets a private home
  directory next to the database (`HERMES_HOME=<db dir>/hermes-home`), so no case
  reads or writes `~/.hermes`;
- the chaos tools (worker.chaos_tools, the same ledger and effect reports) replace
  upstream's tool set: `run_agent.get_tool_definitions` and
  `run_agent.handle_function_call` are swapped at run time (upstream looks both up
  through the `run_agent` module at call time).

Probes. Of our 18 kill points (hermes.probes.POINTS), these fire on upstream 0.19.0:

- `turn.start`, `finalize.before` / `finalize.after`: around `run_conversation`;
- `model.request` / `model.response`: around each model call of the turn loop
  (`_interruptible_streaming_api_call` / `_interruptible_api_call`; upstream makes the
  HTTP request on a per-request client in a helper thread, so wrapping the agent's
  shared client would never see it);
- `model.chunk`: after upstream has taken each streamed chunk (it asks for the next
  one). Upstream streams every model call, with or without `--stream` (it prefers
  streaming for its stale-stream detection), so this fires in every scenario, on the
  helper thread that reads the stream;
- `flush.begin` / `flush.committed`: around `_flush_messages_to_session_db`, once per
  flush, whether or not it has new rows;
- `flush.in_txn`: inside each row's write transaction, after upstream's INSERT (and
  its counter UPDATE) and before its COMMIT. Upstream commits a flush row by row
  (`SessionDB.append_message`, one `BEGIN IMMEDIATE ... COMMIT` each), so a flush of
  k new rows hits this k times and a kill here can leave a flush half committed;
- `callback.interim.*`, `callback.tool_complete.*`: around upstream's UI callbacks;
- `tool.dispatch.*`: around each tool dispatch (`handle_function_call`);
- `resume.begin` / `resume.reconciled`: in this module's `resume()`, the recovery
  step (upstream has none of its own, see below): begin before the durable
  conversation is loaded, reconciled once the message to re-send is chosen. They appear
  only where a worker died and the turn was resumed: self-kill (its tool restarts the
  worker), and the recovery runs of double, random and pause modes.

`compact.in_txn` cannot fire. Upstream compacts (`SessionDB.archive_and_compact`)
only when its token estimate crosses its threshold, a share of the model's context
window never below 64,000 tokens, while every scenario stays at a few hundred tokens;
our `--compact-above ROWS` trigger has no upstream counterpart. Compression is also
switched off here, because upstream's summary request (its own prompt, through its
auxiliary client) is not one the scripted model answers. So in multi-turn-compaction
upstream runs its three turns uncompacted.

List content (``--message-format json``): upstream's `run_conversation(user_message: Any)` takes
a list of OpenAI content parts as the user message, stores it as JSON (`SessionDB._encode_content`)
and reads it back as a list. Text parts reach the model as given. Image parts do not: unless
upstream knows that the model takes images (models.dev, or a `supports_vision` line of
config.yaml), its chat-completions path (`_prepare_messages_for_non_vision_model`) replaces each
with a description made by its vision tool, an auxiliary model call the scripted model never
answers. So a list of text parts is passed through, and one holding an image is refused at start
(`content_parts_refusal`).

Resume: `resume` here loads the durable conversation and, when the last user turn has no
final answer, continues it the way upstream's gateway does after a restart
(worker.targets.hermes_agent_resume): the stored history cleaned by upstream's replay cleanup,
and its recovery note as the user message, never the question again. `--target-option
resume=resend` re-sends the turn's user text with the stored history instead: that is a
caller's behaviour, not upstream's, and what it causes (a question stored twice, say) is the
caller's. The published findings are shown by standalone scripts (examples/repro/hermes_agent/).
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from hermes import probes
from hermes.content import UserContent, has_images
from hermes.extras import install_line
from hermes.private_files import create_private_file, make_private_dirs
from hermes.tools import ToolContext, registry
from hermes.transcript import is_final_answer
from targetkit import ANY, RESULT_PREVIEW, Promises, Target, TargetOption
from worker.targets import Report, open_ledger, show, toolsets_of
from worker.targets.hermes_agent_resume import GATEWAY, RESEND, RESUME_MODES, gateway_replay, is_recovery_row

log = logging.getLogger("worker.targets.hermes_agent")

NAME = "hermes-agent"
VERSION = "0.19.0"

# The documents its labels rest on (facts from them, in our words).
_DOCS = "https://hermes-agent.nousresearch.com/docs"
SESSIONS_DOC = (f"{_DOCS}/user-guide/sessions: every conversation is saved in state.db with its "
                "full message history (tool calls and results included)")
PREVIEW_DOC = ("hermes-agent 0.19.0, tools/tool_result_storage.py (maybe_persist_tool_result): a tool result "
               "over its size limit is replaced by a preview of its beginning, with the path of the whole output "
               "saved in the sandbox or, without one, a note that it was truncated")
CLAIMS_DOC = (f"{_DOCS}/user-guide/sessions and /developer-guide/session-storage: what state.db "
              "keeps (sessions, messages, search indexes; no dispatch record), nothing on when a row is "
              "written relative to a tool run or to what is shown, nor on what a killed turn leaves")

# Upstream hermes-agent records no dispatch intents, shows results before its flush commits them,
# and streams without ever retracting: findings there are CONTRACT, not DAMAGE. Its template
# imports upstream against a neutral home; each worker then sets its own (`preload`, `prepare_home`).
TARGET = Target(
    NAME, "upstream hermes-agent (the `upstream` extra)", adapter=__name__,
    schema="supervisor.chaos.schema.hermes_agent",
    promises=Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False,
                      promised={("no-lost-rows", ANY): SESSIONS_DOC},
                      documented={("result-fidelity", RESULT_PREVIEW): PREVIEW_DOC}, claims=CLAIMS_DOC),
    unsupported={"list-content": "upstream 0.19.0 replaces an image part with its vision tool's description (an "
                                 "auxiliary model call) for a model it does not know to take images",
                 "compaction": "upstream compacts by its token estimate, never below 64,000 tokens, with a summary "
                               "request of its own; --compact-above has no counterpart",
                 "compaction-mid-turn": "upstream compacts by its token estimate, never below 64,000 tokens"},
    options={"resume": TargetOption(RESUME_MODES, GATEWAY,
                                    "how a killed turn is resumed: gateway (upstream's own restart path: the "
                                    "stored history with its replay cleanup and recovery note) or resend (the "
                                    "caller re-sends the question: a caller's behaviour, not upstream's)")},
    forkserver=True, preload=(f"{__name__}:preload",), modules=("run_agent", "hermes_state"),
    extra="upstream", package=f"{NAME}=={VERSION}",
    install_hint=(f"the {NAME} target needs upstream Hermes ({NAME}=={VERSION}, the `upstream` extra): "
                  f"{install_line('upstream')}"))


def content_parts_refusal(parts: list[dict[str, Any]]) -> str | None:
    """None for text parts, which upstream passes through as given; why not for a list holding an
    image part, which upstream 0.19.0 rewrites for a model it does not know sees images (module
    docstring)."""
    if has_images(parts):
        return ("upstream hermes-agent 0.19.0 replaces an image part with a description from its vision tool "
                "(an auxiliary model call) for a model it does not know to take images, so the model would not "
                "be sent the parts as given; text parts only")
    return None


def prepare_home(db_path: Path) -> Path:
    """Give this case its own HERMES_HOME: set before upstream is imported, or, when a fork-server
    template imported upstream already (`preload`), also where upstream kept the home it found
    at import and reads again later (`_rehome`)."""
    home = Path(db_path).resolve().parent / "hermes-home"
    make_private_dirs(home / "logs")
    # An empty config.yaml: upstream's defaults, exactly as with no file at all; but with a file
    # upstream caches its configuration (keyed on the file's mtime and size), while without one
    # it rebuilds it from a deep copy of its defaults on each of the ~20 reads of a turn.
    create_private_file(home / "config.yaml")
    os.environ["HERMES_HOME"] = str(home)
    _rehome(home)
    return home


# Where upstream 0.19.0 keeps the home it found when imported, of what a turn reads later:
# module -> {attribute: path under the home}. `run_agent._hermes_home` is where AIAgent sets up
# its log files; the other two are defaults a turn may look at (the auth file, the default
# database). Everything else a turn reads asks `hermes_constants.get_hermes_home()`, which reads
# HERMES_HOME from the environment at each call; what other modules kept at import (tool
# modules' directories, cron's files) belongs to upstream's own tools, which this adapter
# replaces (`_patch_module`).
_IMPORT_TIME_HOME = {
    "run_agent": {"_hermes_home": ""},
    "hermes_state": {"DEFAULT_DB_PATH": "state.db"},
    "agent.auxiliary_client": {"_AUTH_JSON_PATH": "auth.json"},
}


def _rehome(home: Path) -> None:
    """Point what upstream's already imported modules kept of their import-time home at `home`."""
    for module_name, attributes in _IMPORT_TIME_HOME.items():
        module = sys.modules.get(module_name)
        for attribute, below in attributes.items():
            if module is not None and hasattr(module, attribute):
                setattr(module, attribute, home / below if below else home)


def preload() -> None:
    """In a fork-server template (`TARGET.preload`: the hermes-agent target's `preload`): import
    upstream once, before the first fork, so no worker pays `import run_agent` (over half a second).

    Upstream reads HERMES_HOME while it is imported (and creates its directory skeleton there),
    so the import runs against a neutral home of the template's own: a private temporary
    directory, removed when the template exits. No case ever uses it: each worker sets its own
    home before its turn (`prepare_home`, which also re-points what the import kept of it).
    """
    import atexit
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="hermes-agent-template-"))  # 0700
    atexit.register(shutil.rmtree, home, ignore_errors=True)  # the template's exit only: workers _exit
    make_private_dirs(home / "logs")
    os.environ["HERMES_HOME"] = str(home)
    import hermes_state  # noqa: F401
    import run_agent  # noqa: F401

    for name in _IMPORTED_BY_A_TURN:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _probe_environment()


# What upstream 0.19.0 imports only once a turn runs (found by listing the modules a worker
# imported after its fork), imported by the template instead.
_IMPORTED_BY_A_TURN = (
    "agent.agent_init", "agent.agent_runtime_helpers", "agent.anthropic_adapter", "agent.aux_accounting",
    "agent.bounded_response", "agent.chat_completion_helpers", "agent.coding_context", "agent.conversation_loop",
    "agent.credits_tracker", "agent.display", "agent.errors", "agent.gemini_native_adapter", "agent.gemini_schema",
    "agent.kanban_stop", "agent.lmstudio_reasoning", "agent.model_metadata", "agent.models_dev",
    "agent.moonshot_schema", "agent.prompt_caching", "agent.rate_limit_tracker", "agent.ssl_guard",
    "agent.ssl_verify", "agent.stream_single_writer", "agent.subdirectory_hints", "agent.system_prompt",
    "agent.think_scrubber", "agent.tool_executor", "agent.transports", "agent.transports.anthropic",
    "agent.transports.base", "agent.transports.bedrock", "agent.transports.chat_completions",
    "agent.transports.codex", "agent.transports.types", "agent.turn_finalizer", "agent.turn_retry_state",
    "agent.verification_stop", "agent.verify_hooks", "gateway.session_context", "hermes_cli.codex_models",
    "hermes_cli.moa_config", "hermes_cli.model_normalize", "hermes_cli.models", "hermes_cli.nous_account",
    "hermes_cli.nous_subscription", "hermes_cli.profiles", "hermes_cli.skin_engine", "hermes_logging",
    "logging.handlers", "netrc", "pprint", "tools.budget_config", "tools.checkpoint_manager", "tools.env_probe",
    "tools.hook_output_spill", "tools.mcp_tool", "tools.skill_provenance", "tools.tool_result_storage",
    "tools.tool_search", "unittest.mock",
)


def _probe_environment() -> None:
    """Run upstream's Python-toolchain probe (`tools.env_probe`: a few subprocesses, its result
    cached for the process's life and written into every system prompt) once, here, and wait for
    its thread to end: the template must hold no thread when it forks."""
    try:
        from tools import env_probe
    except ImportError:
        return
    env_probe.get_environment_probe_line()
    thread = getattr(env_probe, "_PROBE_THREAD", None)
    if thread is not None:
        thread.join()


def _turns(conversation: list[dict[str, Any]]) -> tuple[int, UserContent | None, bool]:
    """(index of the last user turn, its message (text, or a list of content parts), whether it has
    a final answer)."""
    index, text, answered = -1, None, False
    for msg in conversation:
        if msg.get("role") == "user":
            if index >= 0 and not answered and (msg.get("content") == text or is_recovery_row(msg.get("content"))):
                continue  # the interrupted turn resumed, or its message taken again (the checker's schema reader)
            index, text, answered = index + 1, msg.get("content"), False
        elif is_final_answer(msg):
            answered = True
    return index, text, answered


class _ChunkProbe:
    """Upstream's model stream, firing `model.chunk` each time upstream has taken a chunk.

    Upstream reads the stream with `for chunk in stream` and otherwise only looks at a
    few attributes (`response`, whether it has `choices`); those pass through. The probe
    fires when upstream asks for the next chunk, i.e. once it has handled the previous
    one (delivered its delta), which is where our runtime's `model.chunk` sits too.
    """

    def __init__(self, stream: Any, fire: Callable[[], None]) -> None:
        self._stream = stream
        self._fire = fire

    def __iter__(self) -> Iterator[Any]:
        for chunk in self._stream:
            yield chunk
            self._fire()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class UpstreamTarget:
    def __init__(self, args: Any, project: Callable[..., None]) -> None:
        self.args = args
        self.project = project  # project(kind, turn=..., **fields): the UI event, acknowledged by the supervisor
        self.home = prepare_home(args.db)
        import hermes_state
        import run_agent

        self.run_agent = run_agent
        self.db = hermes_state.SessionDB(db_path=Path(args.db))
        self.turn_id: str | None = None
        self.toolsets = toolsets_of(args)
        self._patch_module()
        self._wrap_db()

    # ------------------------------------------------------------- wrapping
    def _patch_module(self) -> None:
        ra = self.run_agent
        toolsets = self.toolsets

        def get_tool_definitions(*_a: Any, **_k: Any) -> list[dict[str, Any]]:
            return [t.definition() for t in registry.tools_in(toolsets)]

        def handle_function_call(function_name: str, function_args: dict[str, Any], task_id: str | None = None,
                                 tool_call_id: str | None = None, **_k: Any) -> str:
            ctx = {"session": self.args.session, "turn": self.turn_id, "tool_call_id": tool_call_id,
                   "tool": function_name}
            probes.fire("tool.dispatch.before", **ctx)
            tool = registry.get(function_name)
            if tool is None:
                result = json.dumps({"error": f"unknown tool {function_name!r}"})
            else:
                tctx = ToolContext(task_id=task_id, tool_call_id=tool_call_id, idempotency_key=None,
                                   session_id=self.args.session, turn_id=self.turn_id)
                try:
                    out = tool.handler(function_args or {}, tctx)
                    result = out if isinstance(out, str) else json.dumps(out, default=str)
                except Exception as exc:  # upstream turns a raised tool error into a result too
                    result = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
            probes.fire("tool.dispatch.after", **ctx)
            return result

        ra.get_tool_definitions = get_tool_definitions
        ra.handle_function_call = handle_function_call
        ra.check_toolset_requirements = lambda *a, **k: {}
        try:
            import agent.model_metadata as metadata

            metadata.fetch_model_metadata = lambda *a, **k: {}  # no network lookups of model metadata
        except ImportError:
            pass

    def _wrap_db(self) -> None:
        """`flush.in_txn` inside each message row's write transaction, before its COMMIT.

        `SessionDB.append_message` (called by the agent's flush, once per new row) hands its
        INSERT to `_execute_write(fn)`, which runs BEGIN IMMEDIATE; fn(conn); COMMIT. Both are
        looked up on the instance, so wrapping them on our instance reaches that transaction
        without touching upstream's code: while an append is under way, `fn` is wrapped so the
        probe fires once the row is written and before it is committed. Other writes
        (session rows, token counts) pass through unprobed, as in our runtime.
        """
        db = self.db
        append_message = db.append_message
        execute_write = db._execute_write
        appending = threading.local()  # per thread, in case upstream ever appends off the turn's thread

        def wrapped_append(*a: Any, **k: Any) -> Any:
            appending.active, appending.role = True, k.get("role", a[1] if len(a) > 1 else None)
            try:
                return append_message(*a, **k)
            finally:
                appending.active = False

        def wrapped_execute_write(fn: Callable[[Any], Any], *a: Any, **k: Any) -> Any:
            if not getattr(appending, "active", False):
                return execute_write(fn, *a, **k)
            role = appending.role

            def in_txn(conn: Any) -> Any:
                out = fn(conn)  # the row and the session's counters are written, not yet committed
                probes.fire("flush.in_txn", session=self.args.session, turn=self.turn_id, role=role)
                return out

            return execute_write(in_txn, *a, **k)

        db.append_message = wrapped_append
        db._execute_write = wrapped_execute_write

    def _wrap_agent(self, agent: Any) -> None:
        session = self.args.session
        flush = agent._flush_messages_to_session_db

        def wrapped_flush(*a: Any, **k: Any) -> Any:
            probes.fire("flush.begin", session=session, turn=self.turn_id)
            out = flush(*a, **k)
            probes.fire("flush.committed", session=session, turn=self.turn_id)
            return out

        agent._flush_messages_to_session_db = wrapped_flush

        # model.request / model.response: the turn loop calls one of these two per model call.
        # The streaming one may fall back to the other through the agent, so only the outermost
        # call of a model request fires.
        calling = threading.local()

        def around_model_call(call: Callable[..., Any]) -> Callable[..., Any]:
            def wrapped(*a: Any, **k: Any) -> Any:
                if getattr(calling, "active", False):
                    return call(*a, **k)
                calling.active = True
                try:
                    probes.fire("model.request", session=session, turn=self.turn_id)
                    out = call(*a, **k)
                    probes.fire("model.response", session=session, turn=self.turn_id)
                    return out
                finally:
                    calling.active = False

            return wrapped

        agent._interruptible_streaming_api_call = around_model_call(agent._interruptible_streaming_api_call)
        agent._interruptible_api_call = around_model_call(agent._interruptible_api_call)

        # model.chunk: upstream builds a fresh OpenAI client for every request and reads the
        # stream on a helper thread; wrap the stream that client's create() returns.
        make_client = agent._create_request_openai_client

        def fire_chunk() -> None:
            probes.fire("model.chunk", session=session, turn=self.turn_id)

        def wrapped_make_client(*a: Any, **k: Any) -> Any:
            client = make_client(*a, **k)
            completions = getattr(getattr(client, "chat", None), "completions", None)
            create = getattr(completions, "create", None)
            if create is None:
                return client

            def create_probed(*ca: Any, **ck: Any) -> Any:
                out = create(*ca, **ck)
                # Only a real stream is wrapped: upstream tells a whole response (some adapters
                # answer stream=True with one) from a stream by its `choices` attribute.
                if ck.get("stream") and not hasattr(out, "choices"):
                    return _ChunkProbe(out, fire_chunk)
                return out

            try:
                completions.create = create_probed
            except (AttributeError, TypeError):
                log.warning("cannot wrap upstream's request client; model.chunk is not wired")
            return client

        agent._create_request_openai_client = wrapped_make_client

    def _callbacks(self) -> dict[str, Callable[..., None]]:
        session = self.args.session

        def interim(text: str, *a: Any, **k: Any) -> None:
            probes.fire("callback.interim.before", session=session, turn=self.turn_id)
            self.project("interim", turn=self.turn_id, text=text)
            probes.fire("callback.interim.after", session=session, turn=self.turn_id)

        def tool_complete(call_id: str, name: str, _args: Any, content: Any) -> None:
            ctx = {"session": session, "turn": self.turn_id, "tool_call_id": call_id}
            probes.fire("callback.tool_complete.before", **ctx)
            self.project("tool_complete", turn=self.turn_id, tool_call_id=call_id, tool=name, content=content)
            probes.fire("callback.tool_complete.after", **ctx)

        return {"interim_assistant_callback": interim, "tool_complete_callback": tool_complete}

    def _agent(self) -> Any:
        a = self.args
        agent = self.run_agent.AIAgent(
            base_url=a.base_url, api_key=a.api_key or os.environ.get("OPENAI_API_KEY") or "scripted",
            provider="custom", model=a.model, session_id=a.session, session_db=self.db,
            enabled_toolsets=self.toolsets, quiet_mode=True, skip_context_files=True, skip_memory=True,
            save_trajectories=False, max_iterations=30, tool_delay=0.0, **self._callbacks())
        agent.compression_enabled = False  # no summary request the scripted model cannot answer (module docstring)
        if a.system_prompt is not None:
            agent._cached_system_prompt = a.system_prompt
        self._wrap_agent(agent)
        return agent

    # -------------------------------------------------------------- running
    def _conversation(self) -> list[dict[str, Any]]:
        if self.db.get_session(self.args.session) is None:
            return []
        return self.db.get_messages_as_conversation(self.args.session)

    def _run(self, message: UserContent, history: list[dict[str, Any]], turn_id: str,
             persist: str | None = None) -> dict[str, Any]:
        """`persist`: the user text stored in the message's place (upstream's `persist_user_message`)."""
        self.turn_id = turn_id
        agent = self._agent()
        probes.fire("turn.start", session=self.args.session, turn=turn_id)
        result = agent.run_conversation(message, system_message=self.args.system_prompt,
                                        conversation_history=history or None,
                                        **({} if persist is None else {"persist_user_message": persist}))
        probes.fire("finalize.before", session=self.args.session, turn=turn_id)
        probes.fire("finalize.after", session=self.args.session, turn=turn_id)
        return self._outcome(result, turn_id)

    def _outcome(self, result: dict[str, Any], turn_id: str) -> dict[str, Any]:
        completed = bool(result.get("completed", result.get("final_response")))
        out = {"outcome": "completed" if completed else "failed", "session": self.args.session,
               "turn_id": turn_id, "final_response": result.get("final_response"),
               "turn_exit_reason": result.get("turn_exit_reason"), "api_calls": result.get("api_calls"),
               "target": NAME}
        if not completed:
            out["failure_reason"] = result.get("failure_reason") or "upstream_failed"
            out["error"] = result.get("error")
        return out

    def run(self) -> dict[str, Any]:
        history = self._conversation()
        index, text, answered = _turns(history)
        wanted = self.args.turn_id or f"turn-{index + 1}"
        if f"turn-{index}" == wanted and answered:  # this turn already finished: a no-op, not a duplicate
            return {"outcome": "completed", "session": self.args.session, "turn_id": wanted,
                    "final_response": history[-1].get("content"), "turn_exit_reason": "already_finished",
                    "api_calls": 0, "target": NAME}
        return self._run(self.args.message, history, wanted)

    def resume(self) -> dict[str, Any]:
        """Continue the interrupted turn as upstream's gateway does after a restart, or (resume=resend)
        take its message again, the caller's re-send: see the module docstring."""
        session = self.args.session
        probes.fire("resume.begin", session=session)
        history = self._conversation()
        index, text, answered = _turns(history)
        if index < 0 or answered:
            return {"outcome": "nothing to resume", "target": NAME}
        if (getattr(self.args, "target_options", None) or {}).get("resume", GATEWAY) != RESEND:
            replay, note = gateway_replay(history)
            turn_id = f"turn-{index}"
            self.turn_id = turn_id
            probes.fire("resume.reconciled", session=session, turn=turn_id, action="gateway-recovery-note",
                        dropped=len(history) - len(replay))
            # The gateway's auto-resume event has no text: that empty text is what it persists.
            return self._run(note, replay, turn_id, persist="")
        # Everything from the interrupted turn's (last) user row on is dropped from the history
        # sent back; upstream appends the re-sent message and its rows after the stored ones.
        cut = max(i for i, m in enumerate(history) if m.get("role") == "user")
        turn_id = f"turn-{index}"
        self.turn_id = turn_id
        probes.fire("resume.reconciled", session=session, turn=turn_id, action="resend",
                    dropped=len(history) - cut)
        return self._run(text or "", history[:cut], turn_id)

    def close(self) -> None:
        try:
            self.db.close()
        except Exception:
            pass


def execute(args: Any, link: Any, report: Report) -> int:
    """Run or resume one turn with upstream Hermes, then report its outcome."""
    ledger = open_ledger(args, link)
    try:
        target = UpstreamTarget(args, lambda kind, turn=None, **fields: show(link, args.session, turn, kind, **fields))
        try:
            out = target.resume() if args.command == "resume" else target.run()
        finally:
            target.close()
    finally:
        ledger.close()
    return report(out)
