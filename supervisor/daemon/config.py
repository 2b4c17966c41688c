"""`serve --config FILE`: the daemon's settings in a TOML file, checked before anything starts.

    db = "state.db"                        # relative paths are relative to the file's directory
    # or, one daemon of a fleet: store = "postgresql://host/db" with home = "daemon-a" (claim_ttl = 10)
    base_url = "https://api.example.com/v1"
    model = "some-model"
    api_key_env = "EXAMPLE_API_KEY"        # or: api_key_file = "api.key" (mode 0600)
    system_prompt = "You are terse."       # or: system_prompt_file = "prompt.txt"
    tools = ["examples.notes_tools"]         # or "a,b"; an entry ending in .py is a file, relative to this one
    workers = 4
    synchronous = "FULL"
    stream = false
    http = "127.0.0.1:8080"
    drain_seconds = 30

    [limits]
    max_attempts = 10
    max_model_calls = 50
    turn_timeout = 900
    crash_limit = 5

`load(path)` returns the values under the names of the `serve` flags they stand for
(`tools` joined with commas, paths made absolute); a flag given on the command line wins
over the file. Every path (db, api_key_file, system_prompt_file, log_file, a tools entry
that is a .py file) is relative to the directory of the file, never to where the daemon
was started; `~` is the user's home. An unknown key, a value of the wrong type or out of range, or two keys that
exclude each other raise ConfigError naming the key.
"""
from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

LOG_LEVELS = ("debug", "info", "warning", "error")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass
class DaemonConfig:
    """The daemon's settings, from flags and the file together (supervisor.daemon.cli)."""

    db: Path
    workers: int = 4
    base_url: str | None = None          # None: start the built-in scripted model on loopback
    model: str | None = None
    drain_seconds: float = 30.0
    crash_limit: int = 5                 # K consecutive attempts without durable progress
    backoff_base: float = 0.25
    backoff_max: float = 30.0
    turn_timeout: float = 900.0          # a worker running one turn longer than this is killed
    request_timeout: float = 60.0        # the worker's model request timeout
    poll_seconds: float = 0.25           # how often the inbox is looked at when nothing else happens
    # The workers' --tools: None means the chaos tools for the built-in demo model (no base_url)
    # and none at all for a real model; "" is none.
    tools: str | None = None
    import_paths: list[str] = field(default_factory=list)  # where the workers find the tool modules
    forkserver: bool = True
    system_prompt: str | None = None
    stream: bool = False
    synchronous: str = "FULL"            # the database's durability (daemon and workers)
    max_attempts: int = 10               # worker starts per turn, over all its restarts
    max_model_calls: int = 50            # model calls per turn, over all its workers
    api_key: str | None = field(default=None, repr=False)  # handed to the workers as $OPENAI_API_KEY
    api_key_file: Path | None = None     # or: the 0600 file each worker reads it from
    http: str | None = None              # "HOST:PORT" of the HTTP API (supervisor.daemon.http); None: off
    http_allow_remote: bool = False      # let `http` name a host that is not loopback
    # A fleet (supervisor.daemon.fleet): the PostgreSQL store many daemons share. `db` is then not the
    # store but the base name of this daemon's own files in its home directory (lock, status, token).
    store: str | None = field(default=None, repr=False)  # may hold a password
    claim_ttl: float = 10.0              # how long a claim on a session outlives its daemon's last renewal
    ledger: Path | None = None           # the tools' effects ledger (default: beside `db`)
    workdir: Path | None = None          # where the workers run (default: where serve was started)

    @property
    def location(self) -> str | Path:
        """Where the session store is: the PostgreSQL URL of a fleet, else the SQLite file."""
        return self.store if self.store is not None else self.db


class ConfigError(ValueError):
    """A config file the daemon refuses; the message names the file and the key."""


# ------------------------------------------------------------------ checks
def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _any_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _url(value: Any) -> str:
    if not _text(value).startswith(("http://", "https://")):
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name")
    return value


def _whole(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is not int:
            raise ValueError(f"must be a whole number, not {value!r}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, not {value}")
        return value
    return check


def _seconds(positive: bool) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ValueError(f"must be a finite number of seconds, not {value!r}")
        if value < 0 or (positive and value == 0):
            raise ValueError(f"must be {'more than' if positive else 'at least'} 0, not {value}")
        return float(value)
    return check


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise ValueError(f"must be true or false, not {value!r}")
    return value


def _synchronous(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in ("FULL", "NORMAL"):
        raise ValueError(f"must be \"FULL\" or \"NORMAL\", not {value!r}")
    return value.upper()


def _log_level(value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}, not {value!r}")
    return value.lower()


def is_tool_path(item: str) -> bool:
    """A `tools` entry naming a module by its file (`my_tools.py`, `agent/tools.py`), not by name."""
    return item.strip().endswith(".py")


def _tools(base: Path) -> Callable[[Any], str]:
    """A string ("chaos,examples.notes_tools") or a list of toolset names, module names, or paths
    of .py files (relative to the config file); returned comma-joined, each path made absolute."""
    def check(value: Any) -> str:
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list) or not value:
            raise ValueError("must be a list (or a comma-separated string) of toolset or module names or .py "
                             f"files, like [\"examples.notes_tools\", \"my_tools.py\"], not {value!r}")
        out = []
        for item in value:
            if isinstance(item, str) and is_tool_path(item) and "," not in item:
                out.append(str(base / Path(item.strip()).expanduser()))
            elif isinstance(item, str) and _MODULE_NAME.fullmatch(item.strip()):
                out.append(item.strip())
            else:
                raise ValueError(f"{item!r} is not a toolset or module name, nor the path of a .py file")
        return ",".join(out)
    return check


def http_address(value: Any) -> str:
    """`host:port` (an IPv6 host in brackets); the port 0 to 65535 (0: any free one)."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"must be \"HOST:PORT\", like \"127.0.0.1:8080\", not {value!r}")
    host, _, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in host) or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"must be \"HOST:PORT\" with a port from 0 to 65535, not {value!r}")
    return value


def _path(base: Path) -> Callable[[Any], Path]:
    def check(value: Any) -> Path:
        return base / Path(_text(value)).expanduser()
    return check


# key -> (the serve flag's dest, its check); built per file (paths are relative to it)
def _keys(base: Path) -> dict[str, tuple[str, Callable[[Any], Any]]]:
    path = _path(base)
    return {
        "db": ("db", path),
        "store": ("store", _text),
        "home": ("home", path),
        "claim_ttl": ("claim_ttl", _seconds(positive=True)),
        "ledger": ("ledger", path),
        "workdir": ("workdir", path),
        "base_url": ("base_url", _url),
        "model": ("model", _text),
        "api_key_env": ("api_key_env", _env_name),
        "api_key_file": ("api_key_file", path),
        "system_prompt": ("system_prompt", _any_text),
        "system_prompt_file": ("system_prompt_file", path),
        "tools": ("tools", _tools(base)),
        "workers": ("workers", _whole(1)),
        "synchronous": ("synchronous", _synchronous),
        "stream": ("stream", _bool),
        "http": ("http", http_address),
        "drain_seconds": ("drain_seconds", _seconds(positive=False)),
        "request_timeout": ("request_timeout", _seconds(positive=True)),
        "log_file": ("log_file", path),
        "log_level": ("log_level", _log_level),
        "json_logs": ("json_logs", _bool),
    }


LIMITS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "max_attempts": ("max_attempts", _whole(1)),
    "max_model_calls": ("max_model_calls", _whole(1)),
    "turn_timeout": ("turn_timeout", _seconds(positive=True)),
    "crash_limit": ("crash_limit", _whole(1)),
}
EXCLUSIVE = (("api_key_env", "api_key_file"), ("system_prompt", "system_prompt_file"), ("db", "store"))
# every serve flag a key stands for (`http` is the HTTP API's own flag, when there is one)
DESTS = ("db", "store", "home", "claim_ttl", "ledger", "workdir", "base_url", "model", "api_key_env", "api_key_file", "system_prompt", "system_prompt_file", "tools",
         "workers", "synchronous", "stream", "drain_seconds", "request_timeout", "log_file", "log_level", "json_logs",
         *(dest for dest, _ in LIMITS.values()))


def known_keys() -> list[str]:
    return [*_keys(Path(".")), *(f"limits.{k}" for k in LIMITS)]


def load(path: Path) -> dict[str, Any]:
    """The settings in `path`, checked, under the names of the serve flags (see the module doc)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
    keys = _keys(Path(os.path.abspath(path)).parent)
    out: dict[str, Any] = {}

    def take(name: str, value: Any, spec: tuple[str, Callable[[Any], Any]] | None, table: str) -> None:
        if spec is None:
            known = ", ".join(known_keys())
            raise ConfigError(f"--config {path}: unknown key {table + name!r} (known: {known})")
        dest, check = spec
        try:
            out[dest] = check(value)
        except ValueError as exc:
            raise ConfigError(f"--config {path}: {table}{name}: {exc}") from None

    for name, value in data.items():
        if name == "limits":
            if not isinstance(value, dict):
                raise ConfigError(f"--config {path}: limits must be a table ([limits]), not {value!r}")
            for limit, number in value.items():
                take(limit, number, LIMITS.get(limit), "limits.")
        else:
            take(name, value, keys.get(name), "")
    for first, second in EXCLUSIVE:
        if first in out and second in out:
            raise ConfigError(f"--config {path}: {first} and {second} exclude each other; keep one")
    return out
