"""`serve`: its settings (flags over `--config`), each checked before the daemon starts, so a
mistake is one line and exit 2, never a daemon that fails later; a fleet's store is reached before
`--home` is created."""
from __future__ import annotations

import argparse
import os
import sqlite3
import stat
import sys
from pathlib import Path
from typing import Any

from hermes.text_files import UnreadableText, read_utf8
from supervisor.argtypes import UsageError
from supervisor.daemon.cli_shared import EXIT_FAILED, EXIT_USAGE, PROG, check_reachable, store_url, unreadable, \
    writable_db


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
        return None, writable_db(Path(settings["db"])), ledger
    store = store_url(settings["store"])
    home = settings.get("home")
    if home is None:
        raise UsageError("--store needs --home DIR: this daemon's own files (lock, status, token) live there")
    home = Path(home).absolute()
    if home.exists() and not home.is_dir():
        raise UsageError(f"--home {home} is not a directory")
    check_reachable(store)  # nothing is created for a store out of reach
    return store, home / "fleet", ledger


def _make_home(home: Path) -> None:
    """A fleet daemon's --home (0700), made once every setting was checked and its store answered."""
    from hermes import private_files

    try:
        private_files.make_private_dirs(home)
    except OSError as exc:
        raise UsageError(f"--home {home}: cannot create it ({exc.strerror or exc})") from None


def run_serve(args: argparse.Namespace) -> int:
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
    workdir = settings.get("workdir")
    if workdir is not None and not Path(workdir).is_dir():
        raise UsageError(f"--workdir {workdir} is not a directory")
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
                          api_key=api_key, api_key_file=api_key_file,
                          workdir=Path(workdir).absolute() if workdir is not None else None)
    if config.http:
        _check_http(config, bool(getattr(args, "http_allow_remote", False)))
    if store is not None:
        _make_home(db.parent)
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
    except (StorageError, sqlite3.Error) as exc:  # the store cannot be opened: one line, as every command says it
        raise unreadable(config.store or config.db, exc) from None
