"""`python -m worker`: run one turn of a session, or finish its interrupted turn.

    run    --db PATH --session ID [--base-url URL] [--model NAME] (--message-file PATH | --message-stdin |
           --message TEXT) [--message-format text|json] [--tools NAMES] [--target NAME] [--compact-above ROWS]
    resume --db PATH --session ID [--base-url URL] [--model NAME] [--tools NAMES] [--target NAME]
           [--compact-above ROWS]

The target (default ``hermes``, ours) is the agent that runs the turn; each has an adapter
in ``worker.targets``. ``--tools`` names toolsets or importable modules of ``@tool`` functions
(``worker.targets.load_tools``; default ``chaos``). The session id must pass
``hermes.ids.validate_session_id``.

What a command line holds is readable by every user of the machine (/proc/PID/cmdline), so the
message text and the API key have ways in that keep them out of it: ``--message-file PATH``
(read, never changed or removed) or ``--message-stdin``, and ``--api-key-file PATH`` (0600) or
``$OPENAI_API_KEY``. ``--message`` and ``--api-key`` remain for commands typed by hand.

``--message-format json`` reads the message (from any of the three) as a JSON value: a string, or
a non-empty list of OpenAI chat content parts (``hermes.content``), checked before anything is
opened; a target that cannot pass a list through to its model refuses it before anything is written.

Prints one JSON line with the outcome on stdout; logs JSON lines on stderr.
Exit status: 0 the turn completed (or there was nothing to resume), 1 the turn
failed (its failure fields say why), 2 bad arguments, database or session.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from hermes import probes
from hermes.content import parse_user_content
from hermes.ids import session_id_argument
from hermes.json_logs import JsonLines
from hermes.text_files import UnreadableText, read_utf8
from targetkit.target import OptionError, option_pairs
from worker import targets
from worker.link import ProbeWiring, SupervisorLink
from worker.protocol import EXIT_OK, EXIT_TURN_FAILED, EXIT_USAGE, KILL_MODES, Channel, ChannelClosed, KillPlan
from worker.targets import UsageError

log = logging.getLogger("worker")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one clear line, not a usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m worker", description="Run or resume a turn of an agent session.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in ("run", "resume"):
        sub = commands.add_parser(name)
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument("--db", type=Path, default=None, help="the session database (SQLite)")
        where.add_argument("--store", default=None, metavar="URL",
                           help="the session store on a PostgreSQL server, postgresql://... (our runtime only; "
                                "needs --ledger and the postgres extra)")
        sub.add_argument("--claim", default=None, type=claim_argument, metavar="EPOCH:OWNER",
                         help="with --store: the fleet claim on the session this worker works under (given by "
                              "the daemon that started it); every write checks it is still the session's")
        sub.add_argument("--session", required=True, type=session_id_argument, metavar="ID",
                         help="1-128 ASCII letters, digits, '.', '_', ':', '-', starting with a letter or digit")
        sub.add_argument("--base-url", default=None,
                         help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL)")
        sub.add_argument("--model", default=None, help="the model name (default: $OPENAI_MODEL)")
        sub.add_argument("--tools", default="chaos", metavar="NAMES",
                         help="comma-separated toolsets or importable modules of @tool functions, e.g. "
                              "examples.notes_tools (default: chaos, the chaos harness's tools)")
        key = sub.add_mutually_exclusive_group()
        key.add_argument("--api-key-file", type=Path, default=None, metavar="PATH",
                         help="read the API key from this file (mode 0600: no group or other access)")
        key.add_argument("--api-key", default=None,
                         help="the API key (visible to every user in the process list: prefer --api-key-file or "
                              "$OPENAI_API_KEY, the default)")
        sub.add_argument("--ledger-tools", action="store_true",
                         help="record every call of the --tools modules' tools in the effects ledger with what it "
                              "returned, reporting each effect first, as the chaos tools do; and run them at home "
                              "in the case: HOME the working directory, HERMES_HOME --home (a chaos campaign's "
                              "--tools MODULE)")
        sub.add_argument("--control", type=int, default=None, metavar="FD", help="inherited control socket")
        sub.add_argument("--kill-at", default=None, metavar="PROBE[:N]")
        sub.add_argument("--kill-mode", default="self", choices=KILL_MODES)
        sub.add_argument("--incarnation", type=int, default=0)
        sub.add_argument("--ledger", type=Path, default=None, help="effects ledger (default: DB path + .effects)")
        sub.add_argument("--stream", action="store_true", help="stream model replies")
        sub.add_argument("--synchronous", default="FULL", choices=("FULL", "NORMAL"))
        sub.add_argument("--home", type=Path, default=None, metavar="DIR",
                         help="where the agent keeps its files, tool results too big for the transcript among "
                              "them (default: $HERMES_HOME, else ~/.hermes)")
        sub.add_argument("--save-trajectories", action="store_true",
                         help="append each turn it finishes to trajectories.jsonl in the agent's home")
        sub.add_argument("--busy-budget", type=float, default=10.0, metavar="SECONDS")
        sub.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="model request timeout")
        sub.add_argument("--max-retries", type=int, default=2)
        sub.add_argument("--max-model-calls", type=int, default=None, metavar="N",
                         help="model calls per turn over all its attempts, counted durably on the turn "
                              "(default: no limit beyond the runtime's per-attempt iterations)")
        prompt = sub.add_mutually_exclusive_group()
        prompt.add_argument("--system-prompt-file", type=Path, default=None, metavar="PATH",
                            help="read the system prompt from this file (UTF-8, taken exactly as written)")
        prompt.add_argument("--system-prompt", default=None,
                            help="the system prompt on the command line (visible in the process list)")
        sub.add_argument("--target", default="hermes",
                         help="the agent under test: ours (hermes, the default) or any installed target "
                              "(targetkit.registry)")
        sub.add_argument("--target-option", action="append", default=[], metavar="KEY=VALUE",
                         help="an option of the target, checked by it (e.g. durability=async for langgraph)")
        sub.add_argument("--compact-above", type=rows_argument, default=0, metavar="ROWS",
                         help=("before the turn, and inside it between a tool block's results and the next model "
                               "call, summarize older turns when the session has more active rows (0: never)")
                         if name == "run" else
                         ("inside the resumed turn, between a tool block's results and the next model call, "
                          "summarize older turns when the session has more active rows (0: never)"))
        if name == "run":
            message = sub.add_mutually_exclusive_group(required=True)
            message.add_argument("--message-file", type=Path, default=None, metavar="PATH",
                                 help="read the user message from this file (UTF-8, taken exactly as written; "
                                      "the worker never changes or removes it)")
            message.add_argument("--message-stdin", action="store_true",
                                 help="read the user message from standard input, to its end (UTF-8)")
            message.add_argument("--message", default=None, metavar="TEXT",
                                 help="the user message on the command line (visible to every user in the process "
                                      "list: for commands typed by hand)")
            sub.add_argument("--message-format", default="text", choices=("text", "json"),
                             help="text (default): the message is the text as written; json: it is a JSON value, "
                                  "a string or a non-empty list of content parts ({\"type\": \"text\", \"text\": "
                                  "...} or {\"type\": \"image_url\", \"image_url\": {\"url\": ...}})")
            sub.add_argument("--turn-id", default=None, help="run this queued turn (default: a new turn)")
    return parser


_PARSER: argparse.ArgumentParser | None = None


def _parser() -> argparse.ArgumentParser:
    """`build_parser()`, built once per process (argparse's message lookups touch the file
    system; a fork-server template builds it before forking, see worker.forkserver)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = build_parser()
    return _PARSER


def _read_text(path: Path, what: str) -> str:
    try:
        return read_utf8(path, what)
    except UnreadableText as exc:
        raise UsageError(str(exc)) from None


def _read_api_key(path: Path) -> str:
    """The key in `path`, whitespace around it dropped; refused when others may read the file."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise UsageError(f"--api-key-file {path}: cannot read it ({exc.strerror or exc})") from None
    if mode & 0o077:
        raise UsageError(f"--api-key-file {path}: mode {mode & 0o777:04o} lets other users read the key; "
                         f"chmod 600 {path}")
    key = _read_text(path, "--api-key-file").strip()
    if not key or any(c.isspace() for c in key):
        raise UsageError(f"--api-key-file {path}: expected one API key and nothing else")
    return key


def _read_inputs(args: argparse.Namespace) -> None:
    """Read the API key and the message from where they were asked to come from."""
    if args.api_key_file is not None:
        args.api_key = _read_api_key(args.api_key_file)
    if args.system_prompt_file is not None:
        args.system_prompt = _read_text(args.system_prompt_file, "--system-prompt-file")
    if args.command != "run":
        return
    if args.message_file is not None:
        source = f"--message-file {args.message_file}"
        args.message = _read_text(args.message_file, "--message-file")
    elif args.message_stdin:
        source = "--message-stdin"
        try:
            data = sys.stdin.buffer.read()
        except (OSError, AttributeError, ValueError) as exc:
            raise UsageError(f"--message-stdin: cannot read standard input ({exc})") from None
        try:
            args.message = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"--message-stdin: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    else:
        source = "--message"
    if args.message_format == "json":
        try:
            args.message = parse_user_content(args.message)
        except ValueError as exc:
            raise UsageError(f"--message-format json: {source}: {exc}") from None


def _validate(args: argparse.Namespace) -> KillPlan | None:
    """Check the arguments, cheapest first; then read the inputs and import the tool modules."""
    args.base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if not args.base_url:
        raise UsageError("--base-url is required (or set OPENAI_BASE_URL)")
    args.model = args.model or os.environ.get("OPENAI_MODEL")
    if not args.model:
        raise UsageError("--model is required (or set OPENAI_MODEL)")
    if not args.base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {args.base_url!r} is not an http(s) URL")
    if args.busy_budget < 0 or args.timeout <= 0 or args.max_retries < 0:
        raise UsageError("--busy-budget, --timeout and --max-retries must not be negative")
    if args.max_model_calls is not None and args.max_model_calls < 1:
        raise UsageError("--max-model-calls must be at least 1")
    _check_claim(args)
    if args.store is not None:
        _check_store(args)
    elif args.db.is_dir():
        raise UsageError(f"--db {args.db} is a directory, not a database file")
    elif args.command == "resume" and not args.db.exists():
        raise UsageError(f"--db {args.db} does not exist; there is nothing to resume")
    elif args.command == "run" and not args.db.parent.is_dir():
        raise UsageError(f"--db {args.db}: directory {args.db.parent} does not exist")
    if args.kill_mode != "self" and args.control is None:
        raise UsageError(f"--kill-mode {args.kill_mode} needs --control: the supervisor does the killing")
    try:
        target = targets.target(args.target)
        args.target_options = target.check_options(option_pairs(args.target_option))
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    plan = None
    if args.kill_at is not None:
        try:
            plan = KillPlan.parse(args.kill_at, args.kill_mode)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not probes.is_known(plan.probe):
            raise UsageError(f"--kill-at {args.kill_at!r}: unknown probe; known: {', '.join(probes.POINTS)}")
    _read_inputs(args)
    if args.ledger_tools:  # before the tools' modules are imported: what they read at import counts
        from worker.ledgered_tools import enter_home

        enter_home(args.home)
    try:
        args.toolsets = targets.load_tools(args.tools)
    except ValueError as exc:
        raise UsageError(f"--tools {args.tools!r}: {exc}") from None
    return plan


def claim_argument(value: str) -> tuple[int, str]:
    """`EPOCH:OWNER`, e.g. `3:host-a:4711:9f2c`: the owner is everything after the first colon."""
    epoch, sep, owner = value.partition(":")
    if not sep or not epoch.isdigit() or not owner:
        raise argparse.ArgumentTypeError(f"{value!r} is not EPOCH:OWNER (an epoch number, a colon, an owner name)")
    return int(epoch), owner


def rows_argument(value: str) -> int:
    """A number of rows, 0 or more (`--compact-above`: 0 means never)."""
    try:
        rows = int(value)
    except ValueError:
        rows = -1
    if rows < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of rows (a whole number, 0 for none)")
    return rows


def _check_store(args: argparse.Namespace) -> None:
    """`--store URL`: a PostgreSQL URL, for our runtime, with the files a database path would have
    located named outright (the effects ledger; the agent's home)."""
    from hermes.store.engines import is_postgres_url

    if not is_postgres_url(args.store):
        raise UsageError("--store takes a postgresql:// URL (a SQLite database is --db PATH)")
    if args.target != "hermes":
        raise UsageError(f"--store is for our runtime (--target hermes); {args.target} keeps its own store: --db PATH")
    if args.ledger is None or args.home is None:
        raise UsageError("--store needs --ledger PATH and --home DIR (with --db they default to files beside it)")


def _check_claim(args: argparse.Namespace) -> None:
    if args.claim is not None and args.store is None:
        raise UsageError("--claim is a fleet claim on a PostgreSQL store: it needs --store URL")


_NOISY = ("httpx", "httpx2", "openai", "httpcore")


def _set_level(logger: logging.Logger, level: int) -> None:
    if logger.level != level:  # setLevel empties every logger's cache: only when it changes anything
        logger.setLevel(level)


def quiet_libraries() -> None:
    """The HTTP libraries log warnings and worse only (a fork-server template does it once for its workers)."""
    for noisy in _NOISY:
        _set_level(logging.getLogger(noisy), logging.WARNING)


def _setup_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines({"worker": args.session, "pid": os.getpid(), "incarnation": args.incarnation}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _set_level(root, logging.INFO)
    quiet_libraries()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the supervisor) dies."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def execute(args: argparse.Namespace, plan: KillPlan | None, die_with_parent: bool = True) -> int:
    """Say hello to the supervisor, wire the probes, and let the target's adapter run the command."""
    link = None
    if args.control is not None:
        if die_with_parent:
            _die_with_parent()
        link = SupervisorLink(Channel.from_fd(args.control))
        link.report({"type": "hello", "pid": os.getpid(), "incarnation": args.incarnation,
                     "session": args.session, "command": args.command, "started": time.time()})
    probes.install(ProbeWiring(link, plan))
    name = getattr(args, "target", "hermes")
    adapter = targets.adapter(name)
    targets.check_message(name, adapter, getattr(args, "message", None))  # before the adapter writes anything
    return targets.execute(adapter, args, link, lambda out: _report(args, link, out))


def _report(args: argparse.Namespace, link: SupervisorLink | None, out: dict[str, Any]) -> int:
    """Log, print (one JSON line) and send the outcome; the exit code it stands for."""
    log.info("%s finished: %s %s", args.command, out["outcome"], out.get("failure_reason") or "")
    print(json.dumps(out, ensure_ascii=False, default=str), flush=True)
    if link is not None:
        link.finished = True
        message = {"type": "outcome", "result": out}
        if out.get("final_response") is None:
            link.report(message)
        else:
            try:
                # A final answer is a projection, acknowledged as a UI one is: the supervisor checks it
                # against the database while this worker still holds it open (a worker letting go of
                # its database checkpoints and deletes the WAL under that check).
                link.request(message)
            except ChannelClosed:
                pass  # the supervisor is gone; the outcome is printed above all the same
    return EXIT_OK if out["outcome"] in ("completed", "nothing to resume") else EXIT_TURN_FAILED


def main(argv: Sequence[str] | None = None, *, die_with_parent: bool = True) -> int:
    """The worker entry. A fork-server child passes die_with_parent=False: its parent at that
    instant may be a double fork's short-lived intermediate (worker.forkserver), and a closed
    control channel already stops it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Inherited, not chosen: a shell starts a background job with SIGINT ignored, and that reaches
        # every process below it. A worker answers a Ctrl-C (what it cut off, then it ends on SIGINT).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args = _parser().parse_args(argv)
        plan = _validate(args)
        _setup_logging(args)
        return execute(args, plan, die_with_parent)
    except UsageError as exc:
        print(f"worker: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ChannelClosed as exc:
        print(f"worker: supervisor channel closed ({exc}); stopping", file=sys.stderr)
        return EXIT_TURN_FAILED
    except KeyboardInterrupt:
        # Ctrl-C (SIGINT): the turn answered what it cut off before the interrupt reached here
        # (hermes.executor). End as an interrupted program does, on SIGINT, so whoever started this
        # worker can tell (a fork-server child too, which would otherwise exit with a plain status).
        print("worker: interrupted", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise  # not reached: SIGINT's default action ends the process
