"""The daemon's commands: serve, submit, status, result.

    hermes-supervisor serve  [--config FILE] --db PATH [--workers N] [--base-url URL --model NAME]
                             [--api-key-env NAME | --api-key-file PATH] [--tools MODULE|FILE.py[,...]]
                             [--system-prompt TEXT | --system-prompt-file PATH] [--stream]
                             [--synchronous FULL|NORMAL] [--drain-seconds S] [--max-attempts N]
                             [--max-model-calls N] [--crash-limit K] [--backoff-base S] [--backoff-max S]
                             [--turn-timeout S] [--json-logs] [--log-file PATH] [--log-level LEVEL]
                             [--http HOST:PORT [--http-allow-remote]]
    hermes-supervisor serve  --store postgresql://... --home DIR [--claim-ttl S] [--ledger PATH] [...]
    hermes-supervisor submit (--db PATH [--create] | --store URL) --session ID [--turn-id ID] [--json]
                             (--message-file PATH | --message-file - | - | TEXT)
    hermes-supervisor status (--db PATH | --store URL [--home DIR]) [--session ID] [--json] [--wait [--timeout S]]
    hermes-supervisor result (--db PATH | --store URL) TURN [--wait] [--timeout S] [--json]

`--store URL` (a postgresql:// URL; the `postgres` extra) is a fleet: any number of daemons serve
one PostgreSQL store, each with its own `--home DIR` for its own files (supervisor.daemon.fleet).
Keep a password out of the URL (argv is visible to every user): libpq reads PGPASSWORD, or
~/.pgpass; a password given in the URL reaches the workers through their environment only.

`serve` takes its settings from `--config FILE` (TOML, see supervisor.daemon.config) and
its flags; a flag given wins over the file. Session and turn ids are checked with
`hermes.ids.validate_session_id` wherever one is given. No option is ever abbreviated.

`serve` is ready when it says so: the status file (PATH.daemon.json) names the new daemon
(its pid) from the moment it holds the database, so no reader ever sees a dead daemon's URL
as the live one's; with --http the token file and the status file (with the URL) are written
before the URL is printed, as the first line on stdout. `status --wait` returns once a live
daemon serves the database (the database and the daemon may still be starting).

`submit` refuses a database that does not exist (a mistyped path would otherwise queue
turns nobody serves) unless given --create. The message is TEXT, or read from
--message-file PATH, or from standard input (`-` or `--message-file -`), as UTF-8; trailing
newlines are dropped.

Exit status: serve 0 after a clean stop (SIGTERM/SIGINT), 1 if its --http address cannot be
served or its store cannot be opened now (a PostgreSQL server out of reach), 2 if another daemon already serves the database (a usage error: restarting cannot
help, so systemd's RestartPreventExitStatus=2 stops there); submit 0; status 0, and with
--wait 3 if no live daemon served the database within --timeout; result 0 done, 1 failed, 3
not finished yet (without --wait, or the wait timed out), 4 no such turn; every command 2 on
bad arguments (one line on stderr); 141, quietly, when the reader of stdout went away.

`supervisor.cli` adds these with `add_commands(subparsers)` and runs them with `run(args)`;
`python -m supervisor.daemon.cli ...` runs them on their own. Each command imports what it
needs when it runs: `serve` the daemon (supervisor.daemon.service), the others the inbox.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hermes.ids import session_id_argument
from hermes.text_files import UnreadableText, read_utf8
from supervisor.argtypes import RaisingParser as _Parser
from supervisor.argtypes import UsageError, positive_int, quiet_broken_pipe, seconds

PROG = "hermes-supervisor"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FINISHED, EXIT_UNKNOWN = 0, 1, 2, 3, 4
COMMANDS = ("serve", "submit", "status", "result")




def _turn_id(value: str) -> str:
    """A turn id follows the session id rule (it is a key, a log field, and may name a file)."""
    from hermes.ids import validate_session_id

    try:
        return validate_session_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("session id", "turn id")) from None


def _add_where(parser: argparse.ArgumentParser, db_help: str = "the database the daemon serves") -> None:
    """The store a command reads or writes: a SQLite `--db PATH` or a fleet's `--store URL`."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, metavar="PATH", help=db_help)
    where.add_argument("--store", default=None, metavar="URL", help="a fleet's PostgreSQL store (postgresql://...)")


def add_commands(subparsers: Any) -> None:
    """Add serve, submit, status and result to `subparsers` (its parser_class is used)."""
    serve = subparsers.add_parser("serve", help="run the daemon in the foreground: work through the inbox")
    serve.add_argument("--config", type=Path, default=None, metavar="FILE",
                       help="read the settings from this TOML file (keys as the flags, see README); flags win")
    serve.add_argument("--db", type=Path, default=None, metavar="PATH",
                       help="the session database (created if missing); required here or in --config, "
                            "unless --store")
    serve.add_argument("--store", default=None, metavar="URL",
                       help="serve a PostgreSQL store (postgresql://...) as one daemon of a fleet: every daemon "
                            "given the same URL shares its inbox; needs --home and the postgres extra")
    serve.add_argument("--home", type=Path, default=None, metavar="DIR",
                       help="with --store: this daemon's own directory (lock, status and token files, the "
                            "agent's files); created 0700. One daemon per home")
    serve.add_argument("--claim-ttl", type=seconds, default=None, metavar="SECONDS",
                       help="with --store: how long a daemon's claim on a session outlives its last renewal: "
                            "how soon the others take over the turns of a daemon that died (default 10)")
    serve.add_argument("--ledger", type=Path, default=None, metavar="PATH",
                       help="the tools' effects ledger (default: beside the database, or in --home); daemons "
                            "of a fleet on one host may share one")
    serve.add_argument("--workers", type=positive_int, default=None, metavar="N",
                       help="worker processes at once (default 4)")
    serve.add_argument("--base-url", default=None, metavar="URL",
                       help="OpenAI-compatible endpoint; default: a built-in scripted model on 127.0.0.1")
    serve.add_argument("--model", default=None, metavar="NAME", help="model name (required with --base-url)")
    key = serve.add_mutually_exclusive_group()
    key.add_argument("--api-key-env", default=None, metavar="NAME",
                     help="the environment variable holding the model's API key (handed to the workers in "
                          "their environment, never on a command line)")
    key.add_argument("--api-key-file", type=Path, default=None, metavar="PATH",
                     help="a file holding the model's API key; refused unless only its owner may read it (0600)")
    serve.add_argument("--tools", default=None, metavar="MODULE[,MODULE]",
                       help="the tools offered to the model: toolsets, importable modules of @tool functions, or "
                            ".py files of them (relative to the current directory; in --config, to the file) "
                            "(default: none with --base-url; the chaos tools with the built-in demo model)")
    prompt = serve.add_mutually_exclusive_group()
    prompt.add_argument("--system-prompt", default=None, metavar="TEXT", help="the agent's system prompt")
    prompt.add_argument("--system-prompt-file", type=Path, default=None, metavar="PATH",
                        help="read the system prompt from this file (UTF-8)")
    serve.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                       help="stream the model's replies (default: no)")
    serve.add_argument("--synchronous", type=str.upper, choices=("FULL", "NORMAL"), default=None,
                       help="SQLite durability: FULL (default) fsyncs every commit; NORMAL may lose the last "
                            "commits on power loss, never on a crash")
    serve.add_argument("--drain-seconds", type=seconds, default=None, metavar="SECONDS",
                       help="on SIGTERM/SIGINT, how long running turns may take to end (default 30)")
    serve.add_argument("--max-attempts", type=positive_int, default=None, metavar="N",
                       help="fail a turn once N workers were started for it and none finished it (default 10)")
    serve.add_argument("--max-model-calls", type=positive_int, default=None, metavar="N",
                       help="fail a turn once it made N model calls, over all its workers (default 50)")
    serve.add_argument("--crash-limit", type=positive_int, default=None, metavar="K",
                       help="fail a turn after K attempts in a row that added no durable row (default 5)")
    serve.add_argument("--backoff-base", type=seconds, default=0.25, metavar="SECONDS",
                       help="first restart delay of a turn's worker; doubles per death without progress")
    serve.add_argument("--backoff-max", type=seconds, default=30.0, metavar="SECONDS", help="restart delay cap")
    serve.add_argument("--turn-timeout", type=seconds, default=None, metavar="SECONDS",
                       help="kill a worker whose turn runs longer (counts as a crash; default 900)")
    serve.add_argument("--request-timeout", type=seconds, default=None, metavar="SECONDS",
                       help="the workers' model request timeout (default 60)")
    serve.add_argument("--json-logs", action=argparse.BooleanOptionalAction, default=None, help="log JSON lines")
    serve.add_argument("--log-file", type=Path, default=None, metavar="PATH", help="log here instead of stderr (SIGHUP reopens)")
    serve.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error"))
    serve.add_argument("--no-forkserver", action="store_true",
                       help="start each worker as a fresh interpreter instead of forking a warm template")
    serve.add_argument("--http", default=None, metavar="HOST:PORT",
                       help="also serve the HTTP API here (e.g. 127.0.0.1:8080; port 0: any free port); "
                            "its URL is the first line on stdout. Needs pip install '.[http]'")
    serve.add_argument("--http-allow-remote", action="store_true",
                       help="let --http listen on an address that is not loopback")
    serve.set_defaults(daemon_command="serve")

    submit = subparsers.add_parser("submit", help="queue a user turn; prints its turn id")
    _add_where(submit, "the database the daemon serves; refused if missing, unless --create")
    submit.add_argument("--create", action="store_true", help="make the database if it does not exist yet")
    submit.add_argument("--session", required=True, type=session_id_argument, metavar="ID")
    submit.add_argument("--turn-id", default=None, type=_turn_id, metavar="ID",
                        help="choose the id (submitting it again is a no-op)")
    submit.add_argument("--json", action="store_true")
    submit.add_argument("--message-file", type=Path, default=None, metavar="PATH",
                        help="read the user message from this file (UTF-8); - reads standard input")
    submit.add_argument("text", nargs="?", default=None, metavar="TEXT",
                        help="the user message itself, or - to read it from standard input (use -- before a "
                             "text starting with -); prefer --message-file or stdin: argv is visible to other users")
    submit.set_defaults(daemon_command="submit")

    status = subparsers.add_parser("status", help="sessions, turns and live workers")
    _add_where(status)
    status.add_argument("--home", type=Path, default=None, metavar="DIR",
                        help="with --store: also show the daemon whose home this is")
    status.add_argument("--session", default=None, type=session_id_argument, metavar="ID")
    status.add_argument("--json", action="store_true")
    status.add_argument("--wait", action="store_true",
                        help="first wait until a live daemon serves the database (it and the database may still "
                             "be starting)")
    status.add_argument("--timeout", type=seconds, default=30.0, metavar="SECONDS",
                        help="with --wait: give up after this long, exit 3 (default 30; 0 = forever)")
    status.set_defaults(daemon_command="status")

    result = subparsers.add_parser("result", help="print a turn's final answer")
    _add_where(result)
    result.add_argument("turn", type=_turn_id, metavar="TURN", help="a turn id, as submit printed it")
    result.add_argument("--wait", action="store_true", help="wait until the turn ends")
    result.add_argument("--timeout", type=seconds, default=300.0, metavar="SECONDS",
                        help="with --wait: give up after this long (default 300; 0 = forever)")
    result.add_argument("--json", action="store_true")
    result.set_defaults(daemon_command="result")


# ----------------------------------------------------------------- commands
def _existing_db(path: Path) -> Path:
    if path.is_dir():
        raise UsageError(f"--db {path} is a directory, not a database file")
    if not path.exists():
        raise UsageError(f"--db {path} does not exist")
    return path


def _writable_db(path: Path) -> Path:
    if path.is_dir():
        raise UsageError(f"--db {path} is a directory, not a database file")
    if not path.parent.is_dir():
        raise UsageError(f"--db {path}: directory {path.parent} does not exist")
    return path


def _serve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The serve settings: each flag given, else its key in --config, else absent (the default)."""
    from supervisor.daemon import config as config_file

    loaded: dict[str, Any] = {}
    if args.config is not None:
        try:
            loaded = config_file.load(args.config)
        except config_file.ConfigError as exc:
            raise UsageError(str(exc)) from None
    for group in config_file.EXCLUSIVE:  # a flag of a group replaces the file's whole group
        if any(getattr(args, dest, None) is not None for dest in group):
            for dest in group:
                loaded.pop(dest, None)
    settings = dict(loaded)
    for dest in (*config_file.DESTS, "http"):  # `http`: the HTTP API's flag, checked where it is defined
        value = getattr(args, dest, None)
        if value is not None:
            settings[dest] = value
    return settings


def _read_system_prompt(path: Path) -> str:
    try:
        return read_utf8(path, "--system-prompt-file")
    except UnreadableText as exc:
        raise UsageError(str(exc)) from None


def _api_key(settings: dict[str, Any]) -> tuple[str | None, Path | None]:
    """(the key, to hand to the workers in their environment) or (None, the 0600 file they read it from)."""
    if settings.get("api_key_env") is not None:
        name = settings["api_key_env"]
        value = os.environ.get(name, "").strip()
        if not value:
            raise UsageError(f"api_key_env {name}: the environment variable {name} is not set or empty")
        return value, None
    path = settings.get("api_key_file")
    if path is None:
        return None, None
    path = Path(path).absolute()
    try:
        st = path.stat()
    except OSError as exc:
        raise UsageError(f"api_key_file {path}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"api_key_file {path}: not a regular file")
    if st.st_mode & 0o077:
        raise UsageError(f"api_key_file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users read the key; "
                         f"chmod 600 {path}")
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"api_key_file {path}: cannot read it ({exc})") from None
    if not key or any(c.isspace() for c in key):
        raise UsageError(f"api_key_file {path}: expected one API key and nothing else")
    return None, path


def _tool_files(value: str) -> str:
    """`value` with each entry that is a .py file (relative to the current directory; a config
    file's are absolute already) replaced by its module name, its directory put on the import path."""
    from supervisor.daemon.config import is_tool_path

    names = []
    for item in (n.strip() for n in value.split(",")):
        if not item or not is_tool_path(item):
            names.append(item)
            continue
        path = Path(item).expanduser().absolute()
        if not path.is_file():
            raise UsageError(f"--tools {item!r}: no such file ({path})")
        if not path.stem.isidentifier():
            raise UsageError(f"--tools {item!r}: {path.stem!r} cannot be a Python module name; rename the file")
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        module = sys.modules.get(path.stem)
        if module is None:
            import importlib

            try:
                module = importlib.import_module(path.stem)
            except Exception:  # load_tools imports it again and says why, in one line
                module = None
        origin = getattr(module, "__file__", None)
        if module is not None and (not origin or Path(origin).resolve() != path.resolve()):
            raise UsageError(f"--tools {item!r}: the module name {path.stem!r} is already taken"
                             f"{f' by {origin}' if origin else ''}; rename the file")
        names.append(path.stem)
    return ",".join(names)


def _check_tools(value: str) -> tuple[str, list[str]]:
    """Import the tool modules `value` names, as each worker will; returns the value for the
    workers (each .py file given by its module name) and the directories they need on their import
    path for them. UsageError (one line) if any cannot be offered."""
    from worker.targets import load_tools

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # a module in the directory serve runs in, as `python -m` would find it
    given, value = value, _tool_files(value)
    try:
        load_tools(value)
    except ValueError as exc:
        raise UsageError(f"--tools {given!r}: {exc}") from None
    roots: list[str] = []
    for name in (n.strip() for n in value.split(",")):
        module = sys.modules.get(name.partition(".")[0]) if name else None
        origin = getattr(module, "__file__", None)
        if not origin:
            continue
        folder = Path(origin).parent
        root = str(folder.parent if Path(origin).name == "__init__.py" else folder)
        if root not in roots:
            roots.append(root)
    return value, roots


def _check_http(config: Any, allow_remote: bool) -> None:
    """`--http` (or `http` in --config): a loopback HOST:PORT unless allowed, and its packages installed."""
    from supervisor.daemon.http import INSTALL_HINT, missing_dependencies, parse_listen

    try:
        parse_listen(str(config.http), allow_remote)
    except ValueError as exc:
        raise UsageError(f"--http {config.http}: {exc}") from None
    missing = missing_dependencies()
    if missing:
        raise UsageError(f"--http needs {', '.join(missing)}, which are not installed: {INSTALL_HINT}")
    config.http_allow_remote = allow_remote


def _store_url(url: str) -> str:
    """A `--store` value: a postgresql:// URL, with the driver it needs installed."""
    from hermes.store.engines import is_postgres_url

    if not is_postgres_url(url):
        raise UsageError(f"--store takes a postgresql:// URL, not {url.split('://')[0]!r}... (a SQLite "
                         "database is --db PATH)")
    try:
        import hermes.store.pg.sessiondb  # noqa: F401  (psycopg: the postgres extra)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    return url


def _serve_location(settings: dict[str, Any]) -> tuple[str | None, Path, Path | None]:
    """(the fleet's store URL or None, the database file or the base of a fleet daemon's own files,
    the effects ledger or None for its default)."""
    ledger = settings.get("ledger")
    if ledger is not None and not Path(ledger).parent.is_dir():
        raise UsageError(f"--ledger {ledger}: directory {Path(ledger).parent} does not exist")
    if settings.get("store") is None:
        if settings.get("home") is not None or settings.get("claim_ttl") is not None:
            raise UsageError("--home and --claim-ttl are for a fleet daemon: they go with --store URL")
        if settings.get("db") is None:
            raise UsageError("--db is required (or db in --config), or --store URL for a fleet")
        return None, _writable_db(Path(settings["db"])), ledger
    store = _store_url(settings["store"])
    home = settings.get("home")
    if home is None:
        raise UsageError("--store needs --home DIR: this daemon's own files (lock, status, token) live there")
    home = Path(home).absolute()
    if home.exists() and not home.is_dir():
        raise UsageError(f"--home {home} is not a directory")
    from hermes import private_files

    try:
        private_files.make_private_dirs(home)
    except OSError as exc:
        raise UsageError(f"--home {home}: cannot create it ({exc.strerror or exc})") from None
    return store, home / "fleet", ledger


def _run_serve(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon.config import DaemonConfig
    from supervisor.daemon.fleet import DEFAULT_CLAIM_TTL_S
    from supervisor.daemon.http import HttpStartError
    from supervisor.daemon.inbox import AlreadyRunning
    from supervisor.daemon.service import serve

    settings = _serve_settings(args)
    store, db, ledger = _serve_location(settings)
    base_url, model = settings.get("base_url"), settings.get("model")
    if (base_url is None) != (model is None):
        raise UsageError("--base-url and --model go together (without both, the built-in scripted model is used)")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {base_url!r} is not an http(s) URL")
    turn_timeout = settings.get("turn_timeout", 900.0)
    request_timeout = settings.get("request_timeout", 60.0)
    if turn_timeout <= 0 or request_timeout <= 0:
        raise UsageError("--turn-timeout and --request-timeout must be more than 0")
    log_file = settings.get("log_file")
    if log_file is not None and not Path(log_file).parent.is_dir():
        raise UsageError(f"--log-file {log_file}: directory {Path(log_file).parent} does not exist")
    system_prompt = settings.get("system_prompt")
    if settings.get("system_prompt_file") is not None:
        system_prompt = _read_system_prompt(Path(settings["system_prompt_file"]))
    if system_prompt is not None and len(system_prompt.encode("utf-8")) > 100_000:
        raise UsageError("the system prompt is longer than 100000 bytes")
    api_key, api_key_file = _api_key(settings)
    tools = settings.get("tools")
    if tools is None and base_url is None:
        tools = "chaos"  # the built-in demo model looks things up with the chaos tools
    tools, import_roots = _check_tools(tools) if tools else (tools, [])
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("no_proxy", os.environ["NO_PROXY"])
    backoff_base = args.backoff_base if args.backoff_base is not None else 0.25
    backoff_max = args.backoff_max if args.backoff_max is not None else 30.0
    config = DaemonConfig(db=db.absolute(), store=store, ledger=ledger,
                          claim_ttl=settings.get("claim_ttl", DEFAULT_CLAIM_TTL_S), workers=settings.get("workers", 4), base_url=base_url, model=model,
                          drain_seconds=settings.get("drain_seconds", 30.0),
                          crash_limit=settings.get("crash_limit", 5),
                          max_attempts=settings.get("max_attempts", 10),
                          max_model_calls=settings.get("max_model_calls", 50),
                          backoff_base=backoff_base, backoff_max=max(backoff_max, backoff_base),
                          turn_timeout=turn_timeout, request_timeout=request_timeout,
                          forkserver=not args.no_forkserver, tools=tools or "", import_paths=import_roots,
                          system_prompt=system_prompt, stream=bool(settings.get("stream", False)),
                          synchronous=settings.get("synchronous", "FULL"), http=settings.get("http"),
                          api_key=api_key, api_key_file=api_key_file)
    if config.http:
        _check_http(config, bool(getattr(args, "http_allow_remote", False)))
    try:
        return serve(config, json_logs=bool(settings.get("json_logs", False)),
                     log_file=Path(log_file) if log_file is not None else None,
                     log_level=settings.get("log_level", "info"))
    except AlreadyRunning as exc:  # a usage error: a restart cannot help (RestartPreventExitStatus=2)
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HttpStartError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    except sqlite3.Error as exc:  # the store cannot be reached now (a server down): a restart may help
        print(f"{PROG}: error: cannot open the session store: {exc}".replace("\n", " "), file=sys.stderr)
        return EXIT_FAILED


def _message(args: argparse.Namespace) -> str:
    """The user message: TEXT, or the --message-file, or standard input (`-`); never empty."""
    if args.text is not None and args.message_file is not None:
        raise UsageError("give the message once: TEXT or --message-file, not both")
    if args.text is None and args.message_file is None:
        raise UsageError("no message: give --message-file PATH, - to read standard input, or TEXT")
    if args.text is not None and args.text != "-":
        text, what = args.text, "TEXT"
    elif args.text == "-" or str(args.message_file) == "-":
        what = "the message on standard input"
        try:
            data = sys.stdin.buffer.read() if sys.stdin is not None else b""
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the message from standard input ({exc})") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    else:
        what = f"--message-file {args.message_file}"
        try:
            text = read_utf8(args.message_file, "--message-file")
        except UnreadableText as exc:
            raise UsageError(str(exc)) from None
    text = text.rstrip("\r\n")  # the newline a file or `echo` ends with is not part of the message
    if not text.strip():
        raise UsageError(f"{what} is empty")
    return text


def _run_submit(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon import inbox

    if args.store is not None:
        if args.create:
            raise UsageError("--create is for a SQLite --db: a PostgreSQL store is created by its first daemon")
        where: str | Path = _store_url(args.store)
    else:
        where = db = _writable_db(args.db)
        if not args.create and not db.exists():
            raise UsageError(f"--db {db} does not exist: is it the database the daemon serves? "
                             "(add --create to make a new one)")
    if not args.session.strip():
        raise UsageError("--session must not be empty")
    text = _message(args)
    try:
        turn_id, new = inbox.submit(where, args.session, text, args.turn_id)
    except (StorageError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps({"turn": turn_id, "session": args.session, "queued": new}))
    else:
        print(turn_id)
    return EXIT_OK


def _age(since: Any) -> str:
    try:
        return f"{max(0.0, time.time() - float(since)):.1f}s"
    except (TypeError, ValueError):
        return "?"


def _print_status(data: dict[str, Any]) -> None:
    daemon = data["daemon"]
    live = [w for w in daemon.get("workers", []) if w.get("alive")]
    if daemon.get("pid"):
        print(f"daemon: {daemon['state']} (pid {daemon['pid']}), {len(live)}/{daemon.get('workers_max', '?')} "
              f"workers busy, model {daemon.get('model')} at {daemon.get('base_url')}")
    elif daemon.get("state") == "not asked":
        print(f"store: {data['db']} (a fleet; --home DIR shows one of its daemons)")
    else:
        print("daemon: not running")
    for claim in data.get("claims", []):
        print(f"  session {claim['session_id']} claimed by {claim['owner']} (epoch {claim['epoch']}, "
              f"{max(0.0, claim['expires_in']):.1f}s left)")
    if daemon.get("pid") and (daemon.get("http") or {}).get("url"):
        print(f"http API: {daemon['http']['url']}")
    for w in live:
        print(f"  worker pid {w['pid']}  session {w['session']}  turn {w['turn']}  for {_age(w.get('started_at'))}")
    counts = data["counts"]
    print("turns: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("queued", "running", "done", "failed")))
    for session in data["sessions"]:
        print(f"session {session['id']}")
        for turn in session["turns"]:
            line = f"  {turn['id']}  {turn['state']:7}  attempts {turn['attempts']}"
            if turn.get("model_calls"):
                line += f"  model calls {turn['model_calls']}"
            if turn["crashes"]:
                line += f"  crashes {turn['crashes']}"
            if turn["error"]:
                line += f"  error: {turn['error']}"
            print(line)


class NotServed(Exception):
    """`status --wait` timed out: no live daemon served the database."""


def _wait_until_served(db: Path, timeout: float) -> None:
    """Return once a live daemon serves `db` (its status file names a running process that is
    still that very process); NotServed after `timeout` seconds (0: wait forever)."""
    from supervisor.daemon import inbox

    if db.is_dir():
        raise UsageError(f"--db {db} is a directory, not a database file")
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while True:
        view = inbox.daemon_view(db) if db.exists() or inbox.status_path(db).exists() else None
        if view is not None and view.get("alive") and view.get("state") == "running":
            return
        if deadline is not None and time.monotonic() >= deadline:
            seen = "the database does not exist" if view is None else f"daemon: {view.get('state')}"
            raise NotServed(f"no live daemon serves {db} after {timeout:g}s ({seen}); is `serve --db {db}` "
                            "running? its log says why not")
        time.sleep(0.05)


def _run_status(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon import inbox

    if args.store is not None:
        where: str | Path = _store_url(args.store)
        files = Path(args.home).absolute() / "fleet" if args.home is not None else None
        if args.wait:
            if files is None:
                raise UsageError("status --store --wait needs --home DIR: the daemon to wait for")
            _wait_until_served(files, args.timeout)
    else:
        if args.home is not None:
            raise UsageError("--home goes with --store (a SQLite daemon's files are beside its --db)")
        if args.wait:
            _wait_until_served(args.db, args.timeout)
        where = files = _existing_db(args.db)
    try:
        data = inbox.snapshot(where, args.session, files=files)
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read {_shown(where)}: {exc}") from None
    if args.json:
        print(json.dumps(data, ensure_ascii=False, default=str))
    else:
        _print_status(data)
    return EXIT_OK


def _shown(where: str | Path) -> str:
    """A store's location as it may be printed: a URL without its password."""
    if isinstance(where, Path):
        return str(where)
    from hermes.store.pg.connection import redact

    return redact(where)


def _run_result(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from hermes.store.engines import open_store
    from supervisor.daemon import inbox

    db_path = _store_url(args.store) if args.store is not None else _existing_db(args.db)
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    try:
        with open_store(db_path, readonly=True) as db:
            while True:
                turn = db.get_turn(args.turn)
                if turn is None:
                    print(f"{PROG}: error: no turn {args.turn!r} in {_shown(db_path)}", file=sys.stderr)
                    return EXIT_UNKNOWN
                if turn["state"] in ("done", "failed") or not args.wait:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            answer = inbox.final_answer(db, turn) if turn["state"] == "done" else None
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read {_shown(db_path)}: {exc}") from None
    if args.json:
        print(json.dumps({"turn": turn["id"], "session": turn["session_id"], "state": turn["state"],
                          "answer": answer, "error": turn["error"]}, ensure_ascii=False))
    if turn["state"] == "done":
        if not args.json:
            print(answer if answer is not None else "")
        return EXIT_OK
    if turn["state"] == "failed":
        if not args.json:
            print(f"{PROG}: turn {turn['id']} failed: {turn['error']}", file=sys.stderr)
        return EXIT_FAILED
    if not args.json:
        waited = " (timed out waiting)" if args.wait else ""
        print(f"{PROG}: turn {turn['id']} is {turn['state']}, not finished yet{waited}", file=sys.stderr)
    return EXIT_NOT_FINISHED


_RUNNERS = {"serve": _run_serve, "submit": _run_submit, "status": _run_status, "result": _run_result}


def run(args: argparse.Namespace) -> int:
    """Execute a parsed serve/submit/status/result command; usage errors print one line and return 2."""
    try:
        command = getattr(args, "daemon_command", None) or getattr(args, "command", None)
        if command not in _RUNNERS:
            raise UsageError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
        return _RUNNERS[command](args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NotServed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_NOT_FINISHED


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="The hermes daemon: a durable inbox worked by supervised workers.")
    add_commands(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            args = build_parser().parse_args(argv)
        except UsageError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        code = run(args)
        sys.stdout.flush()  # here, where a reader that left (`status | head`) is caught below
        return code
    except BrokenPipeError:
        return quiet_broken_pipe()


if __name__ == "__main__":
    sys.exit(main())
