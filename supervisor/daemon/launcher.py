"""How the daemon starts a worker for a turn: the command, the files it reads, the warm pool.

A worker is `python -m worker run --turn-id T --message-file F ...`, forked from a warm
template (supervisor.procs.pool). No command line carries the user's text, the system prompt
or the API key: the text is in F and the prompt in a file beside it (both 0600, in the 0700
directory `PATH.daemon.msgs`, emptied at start and stop), the key in the worker's
environment (or a 0600 file it reads). A template that died is replaced by a fresh pool; the
old one is kept until shutdown so its workers are still reaped.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable

import psutil

from hermes import private_files
from supervisor.daemon import inbox
from supervisor.daemon.config import DaemonConfig
from supervisor.daemon.log import log, warn
from supervisor.procs.pool import Pool, WorkerProcess


class Launcher:
    def __init__(self, config: DaemonConfig, *, base_url: str, model: str, tools: str) -> None:
        self.config = config
        self.db_path = Path(config.db)
        self.base_url = base_url
        self.model = model
        self.tools = tools
        self.messages_dir = inbox.messages_path(self.db_path)
        self.pool: Pool | None = None
        self.retired: list[Pool] = []
        self._system_prompt_file: Path | None = None

    def start(self) -> None:
        """Empty the message directory of what a killed daemon left, write the prompt, warm a template."""
        self.clear_messages()
        if self.config.system_prompt is not None:
            self._system_prompt_file = self.messages_dir / "system-prompt.txt"
            private_files.write_private(self._system_prompt_file, self.config.system_prompt)
        self.pool = self._new_pool()

    def _new_pool(self) -> Pool:
        env: dict[str, str] = {}
        if self.config.api_key:
            env["OPENAI_API_KEY"] = self.config.api_key  # in the environment, never on a command line
        if self.config.store is not None:
            from hermes.store.pg.connection import split_password

            _url, password = split_password(self.config.store)
            if password is not None:
                env["PGPASSWORD"] = password  # libpq reads it; a command line is visible to every user
        if self.config.import_paths:
            env["PYTHONPATH"] = os.pathsep.join([*self.config.import_paths,
                                                 *filter(None, [os.environ.get("PYTHONPATH")])])
        # A fleet's workers use psycopg: imported once by the template, not once per worker (~150 ms each).
        preload = ("hermes.store.pg.sessiondb",) if self.config.store is not None else ()
        return Pool(forkserver=self.config.forkserver, env=env, preload=preload, cwd=self.config.workdir)

    def clear_messages(self) -> None:
        """The private directory of message files (0700), emptied."""
        private_files.make_private_dirs(self.messages_dir)
        os.chmod(self.messages_dir, private_files.DIR_MODE)
        for leftover in self.messages_dir.iterdir():
            leftover.unlink(missing_ok=True)

    def message_file(self, incarnation: int) -> Path:
        return self.messages_dir / f"worker-{incarnation}.msg"

    def argv(self, session: str, turn_id: str, message_file: Path, claim: str | None = None) -> list[str]:
        """The worker's command for `turn_id`; `claim`: the fleet claim it works under (`--claim`)."""
        config = self.config
        ledger = config.ledger or inbox.ledger_path(self.db_path)
        if config.store is not None:
            from hermes.store.pg.connection import split_password

            where = [f"--store={split_password(config.store)[0]}", f"--home={self.db_path.parent / 'agent'}"]
            if claim is not None:
                where.append(f"--claim={claim}")
        else:
            where = [f"--db={self.db_path}"]
        argv = ["run", *where, f"--session={session}", f"--base-url={self.base_url}",
                f"--model={self.model}", f"--tools={self.tools}", f"--synchronous={config.synchronous}",
                f"--ledger={ledger}", f"--timeout={config.request_timeout}",
                f"--max-model-calls={config.max_model_calls}", f"--turn-id={turn_id}",
                f"--message-file={message_file}"]
        if config.stream:
            argv.append("--stream")
        if self._system_prompt_file is not None:
            argv.append(f"--system-prompt-file={self._system_prompt_file}")
        if config.api_key_file is not None:
            argv.append(f"--api-key-file={config.api_key_file}")
        return argv

    def spawn(self, argv: list[str], incarnation: int, on_message: Callable[[WorkerProcess, dict[str, Any]], None],
              on_log: Callable[[WorkerProcess, bytes], None],
              on_exit: Callable[[WorkerProcess], None]) -> WorkerProcess:
        assert self.pool is not None
        return self.pool.spawn(argv, incarnation=incarnation, on_message=on_message, on_log=on_log, on_exit=on_exit)

    def replace_pool_if_broken(self) -> None:
        """The warm template died (it should not): retire that pool and start a fresh one."""
        assert self.pool is not None
        template = self.pool.template
        if template is None or template.poll() is None:
            return
        warn("the worker template died; starting a new one", exit_status=template.returncode)
        self.retired.append(self.pool)
        self.pool = self._new_pool()

    def templates(self) -> list[dict[str, Any]]:
        """The live templates' pids and start times (for the status file: the next start kills leftovers)."""
        out = []
        for pool in [p for p in (self.pool, *self.retired) if p is not None]:
            process = pool.template
            if process is not None and process.poll() is None:
                try:
                    out.append({"pid": process.pid, "create_time": psutil.Process(process.pid).create_time()})
                except psutil.Error:
                    pass
        return out

    def close(self) -> None:
        """Kill every worker and template by recorded pid, reap them, empty the message directory."""
        for pool in [p for p in (self.pool, *self.retired) if p is not None]:
            try:
                pool.close()
            except Exception as exc:
                log.error("closing the worker pool: %s", exc)
        self.pool, self.retired = None, []
        try:
            self.clear_messages()
        except OSError:
            pass


def kill_recorded(entries: list[dict[str, Any]]) -> None:
    """Kill the process groups a previous daemon recorded as its workers and templates (status
    file entries with pid and create_time), if each is still that very process."""
    for entry in entries:
        pid = entry.get("pid")
        if not isinstance(pid, int) or pid <= 1:
            continue  # never a group of ours (0) or every process (1, -1)
        if inbox.process_alive(pid, entry.get("create_time")):
            try:
                os.killpg(pid, signal.SIGKILL)
                warn("killed a leftover process of a previous daemon", pid=pid)
            except (ProcessLookupError, PermissionError):
                pass
