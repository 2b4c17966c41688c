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
~/.pgpass; a password given in the URL reaches the workers through their environment only,
decoded as libpq decodes it (supervisor.daemon.launcher, hermes.store.pg.url).

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
served; submit 0; status 0 when the daemon it shows is alive (or, for `--store` without
`--home`, when no daemon was asked about), 3 when none is (not started, stopped, or dead), and
with --wait 3 if no live daemon served the database within --timeout; result 0 done, 1 failed, 3
not finished yet (without --wait, or the wait timed out), 4 no such turn; every command 2 on bad
arguments and on a store it cannot reach or read (a PostgreSQL server out of reach, a malformed
URL), and serve 2 if another daemon already serves the database (usage errors: restarting cannot
help, so systemd's RestartPreventExitStatus=2 stops there), always one line on stderr, a URL's
password never in it; 141, quietly, when the reader of stdout went away.

The verbs live by group: `cli_serve` (serve), `cli_inbox` (submit, status, result), and what
they share in `cli_shared` (exit codes, `--db`/`--store`, an unreachable store said in one line).

`supervisor.cli` adds these with `add_commands(subparsers)` and runs them with `run(args)`;
`python -m supervisor.daemon.cli ...` runs them on their own. Each command imports what it
needs when it runs: `serve` the daemon (supervisor.daemon.service), the others the inbox.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from hermes.ids import session_id_argument
from supervisor.argtypes import RaisingParser as _Parser
from supervisor.argtypes import UsageError, positive_int, quiet_broken_pipe, seconds
from supervisor.daemon.cli_shared import EXIT_NOT_FINISHED, EXIT_USAGE, PROG, NotServed
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
    serve.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                       help="where the workers run, so that a tool writing a relative path writes there "
                            "(default: the directory serve was started in)")
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
                            "its URL is the first line on stdout. Needs the http extra (./scripts/setup http in a checkout)")
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


def _runner(command: str) -> Callable[[argparse.Namespace], int]:
    """A verb's function, its module imported only when the verb runs."""
    if command == "serve":
        from supervisor.daemon.cli_serve import run_serve

        return run_serve
    from supervisor.daemon import cli_inbox

    return {"submit": cli_inbox.run_submit, "status": cli_inbox.run_status, "result": cli_inbox.run_result}[command]


def run(args: argparse.Namespace) -> int:
    """Execute a parsed serve/submit/status/result command; usage errors print one line and return 2."""
    try:
        command = getattr(args, "daemon_command", None) or getattr(args, "command", None)
        if command not in COMMANDS:
            raise UsageError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
        return _runner(command)(args)
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
