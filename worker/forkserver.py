"""A warm template process that forks ready-to-run workers.

Starting `python -m worker` costs an interpreter start plus `import openai`
(about half a second). The template pays that once: it imports everything a
worker needs, opens no database and runs no second thread when it forks, then waits
on an inherited socket for spawn requests. For each request it forks the worker (its
own session and process group, stderr on the pipe it was handed, its control channel
on the socket it was handed) as a child of the supervisor, which so reaps each worker
itself, exactly once: in one step where Linux allows it (worker.siblings: clone with
CLONE_PARENT), else by a double fork whose intermediate exits at once, so the worker is
re-parented to the supervisor (a child subreaper).

`python -m worker.forkserver FD [--preload MODULE[:FUNCTION]]...`: before its first fork the
template imports each such module (and calls that function of it, e.g. to give upstream
Hermes a neutral home to import against, see worker.targets.hermes_agent.preload), so a
target's own packages (upstream's `run_agent`, LangGraph, the Agents SDK) are imported once
per template instead of once per worker (`targetkit.Target.preload`).

Request frame (worker.protocol.send_with_fds): {"argv": [...], "cwd": DIR} with two file
descriptors attached: the worker's control socket and its stderr pipe. Reply:
{"pid": N} (N > 1, always the worker's own pid) or {"error": "..."}. A fork that fails (in
the template, or in the intermediate of a double fork) is an error reply; a forked process
exits whatever happens, so it can never go on as a second template.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import socket
import sys

import openai  # noqa: F401  (preloaded: the point of the template)

import hermes.resume  # noqa: F401
import hermes.runner  # noqa: F401
import worker.chaos_tools  # noqa: F401  (imported by every worker's `--tools chaos`)
import worker.ledger  # noqa: F401
from worker import main as worker_main
from worker import siblings, targets
from worker.protocol import Channel, recv_with_fds
from worker.targets import hermes as hermes_target

# Argument lists parsed once in the template, so that what argparse compiles and caches on a
# first parse (its regular expressions) is inherited by every worker instead of redone.
_WARM_UP_ARGV = (
    ["run", "--db", "warm-up.db", "--session", "warm-up", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
     "--message", "warm up", "--turn-id", "turn-0", "--ledger", "warm-up.effects", "--timeout", "20",
     "--busy-budget", "2", "--kill-at", "turn.start:1", "--kill-mode", "self", "--incarnation", "1",
     "--control", "9"],
    ["resume", "--db", "warm-up.db", "--session", "warm-up", "--base-url", "http://127.0.0.1:9/v1",
     "--model", "m", "--stream", "--incarnation", "2"],
)

# A request with every kind of message a turn sends: the SDK caches what it learns of each
# parameter type on its first request of that shape, so the first one is made here.
_WARM_UP_HISTORY = [
    {"role": "user", "content": "warm up"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_warm", "type": "function", "function": {"name": "lookup", "arguments": "{\"key\": \"k\"}"}}]},
    {"role": "tool", "tool_call_id": "call_warm", "content": "{\"key\": \"k\"}"},
]

_WARM_UP_REPLY = {
    "id": "warm-up", "object": "chat.completion", "created": 0, "model": "warm-up",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_warm", "type": "function",
                        "function": {"name": "lookup", "arguments": "{\"key\": \"k\"}"}}]}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def _warm_up_stream() -> bytes:
    chunk = {"id": "warm-up", "object": "chat.completion.chunk", "created": 0, "model": "warm-up"}
    events = [dict(chunk, choices=[{"index": 0, "delta": {"role": "assistant", "content": "warm"},
                                    "finish_reason": None}]),
              dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def warm_up() -> None:
    """Do here, once, the work every worker would otherwise repeat after its fork.

    The SDK imports its HTTP stack when the first client is built and its chat resources
    and stream parser on the first request; a TLS context costs a CA-store load. So: build
    the workers' HTTP client and its TLS context (worker.targets.hermes.http_client), then run
    one plain and one streamed model call through an in-memory transport (no socket, no
    thread, no database), and import the codec getaddrinfo needs for a host name; parse a
    worker's command lines once, resolve the chaos toolset, read the targets' entry points and
    quiet the HTTP libraries' loggers. Best effort: a failure here only leaves the workers as slow as fresh ones.
    """
    try:
        import encodings.idna  # noqa: F401  (socket.getaddrinfo encodes host names with it)

        parser = worker_main._parser()
        for argv in _WARM_UP_ARGV:
            parser.parse_args(argv)
        targets.load_tools("chaos")
        targets.target("hermes")  # the registry's scan of the installed entry points, once
        worker_main.quiet_libraries()
        hermes_target.http_client("http://127.0.0.1:9/v1", 60.0)  # built once, for every worker
        httpx = hermes_target.sdk_http_module()

        def reply(request):  # type: ignore[no-untyped-def]
            if json.loads(request.content).get("stream"):
                return httpx.Response(200, content=_warm_up_stream(),
                                      headers={"content-type": "text/event-stream"})
            return httpx.Response(200, json=_WARM_UP_REPLY)

        for stream in (False, True):
            client = openai.DefaultHttpxClient(transport=httpx.MockTransport(reply))
            agent = hermes.runner.AIAgent(api_key="warm-up", base_url="http://127.0.0.1:9/v1", model="warm-up",
                                          stream=stream, max_retries=0,
                                          http_client=client)
            agent._call_model(_WARM_UP_HISTORY, "warm up")
            agent.client.close()
    except Exception as exc:  # noqa: BLE001
        print(f"worker.forkserver: warm-up skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    # What the template holds now lives as long as it does: keep it out of the children's
    # garbage collections (each collection would otherwise walk, and so copy, those pages).
    gc.collect()
    gc.freeze()


def _become_worker(request: dict, control_fd: int, stderr_fd: int, server: socket.socket) -> None:
    """In the grandchild: a session of its own, its own stdio and working directory, then the
    ordinary worker entry."""
    os.setsid()
    server.close()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(stderr_fd, 2)
    os.close(devnull)
    os.close(stderr_fd)
    argv = list(request["argv"])
    code = 1
    profiler = _profiler() if PROFILE_ENV in os.environ else None
    try:
        cwd = request.get("cwd")
        if cwd:
            try:
                os.chdir(cwd)  # as a fresh interpreter started there would be
            except OSError as exc:
                print(f"worker: cannot work in {cwd}: {exc.strerror}", file=sys.stderr)
                return  # exits 1, below
        code = worker_main.main([*argv, "--control", str(control_fd)], die_with_parent=False)
    finally:
        if profiler is not None:
            _save_profile(profiler)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# `python -m bench --only recovery --profile DIR` sets this in the template's environment: each
# forked worker then profiles its own life (from just after the fork) and leaves it in DIR. A worker
# cannot be profiled from outside from its first instruction: a sampler attaches after it started.
PROFILE_ENV = "HERMES_WORKER_PROFILE"


def _profiler() -> object | None:
    try:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0002, async_mode="disabled")
        profiler.start()
        return profiler
    except Exception as exc:  # noqa: BLE001  (no pyinstrument: the worker runs unprofiled)
        print(f"worker.forkserver: no profile ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def _save_profile(profiler: object) -> None:
    try:
        session = profiler.stop()  # type: ignore[attr-defined]
        session.save(os.path.join(os.environ[PROFILE_ENV], f"worker-{os.getpid()}.pyisession"))
    except Exception as exc:  # noqa: BLE001
        print(f"worker.forkserver: profile not saved ({type(exc).__name__}: {exc})", file=sys.stderr)


def _spawn(request: dict, fds: list[int], server: socket.socket) -> int:
    """Fork a worker as the supervisor's child; its pid (> 1). OSError when a fork fails: the
    template goes on serving, and nothing it forked lives on (no fork returns into this loop)."""
    if siblings.available():
        return _spawn_sibling(request, fds, server)
    return _spawn_double(request, fds, server)


def _spawn_sibling(request: dict, fds: list[int], server: socket.socket) -> int:
    """One fork whose child is the supervisor's (worker.siblings)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = siblings.fork_sibling()
        if pid == 0:
            try:
                control_fd, stderr_fd = fds
                _become_worker(request, control_fd, stderr_fd, server)
            finally:
                os._exit(1)  # _become_worker exits by itself; this only catches a failure before it
    finally:
        for fd in fds:
            os.close(fd)
    if pid <= 1:
        raise OSError(f"the fork returned pid {pid}")
    return pid


def _spawn_double(request: dict, fds: list[int], server: socket.socket) -> int:
    """Double-fork a worker: an intermediate forks it and exits, so it is re-parented."""
    read_end, write_end = os.pipe()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        middle = os.fork()
        if middle == 0:
            _intermediate(request, fds, server, read_end, write_end)  # never returns
        os.close(write_end)
        write_end = -1
        _, status = os.waitpid(middle, 0)  # it exits at once; the worker is now the subreaper's child
        reply = os.read(read_end, 512).decode("ascii", "replace")
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
        for fd in fds:
            os.close(fd)
    if reply.isdigit() and int(reply) > 1 and os.waitstatus_to_exitcode(status) == 0:
        return int(reply)
    raise OSError(reply.partition(":")[2].strip() if reply.startswith("error:")
                  else f"the intermediate process ended with status {os.waitstatus_to_exitcode(status)} "
                       f"and reported {reply!r}")


def _intermediate(request: dict, fds: list[int], server: socket.socket, read_end: int, write_end: int) -> None:
    """In the intermediate child: fork the worker, report its pid (or why there is none) on
    `write_end`, and exit. Whatever happens, it exits here and never serves requests."""
    code = 1
    try:
        os.close(read_end)
        worker = os.fork()
        if worker == 0:
            try:
                os.close(write_end)
                control_fd, stderr_fd = fds
                _become_worker(request, control_fd, stderr_fd, server)
            finally:
                os._exit(1)  # _become_worker exits by itself; this only catches a failure before it
        os.write(write_end, str(worker).encode())
        code = 0
    except BaseException as exc:  # noqa: BLE001  (a failed fork: say so, then exit)
        try:
            os.write(write_end, f"error: {type(exc).__name__}: {exc}".encode("ascii", "replace")[:500])
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def serve(fd: int) -> int:
    server = socket.socket(fileno=fd)
    replies = Channel(server)
    while True:
        try:
            received = recv_with_fds(server)
        except (OSError, ValueError):
            return 1
        if received is None:
            return 0  # the supervisor closed the socket: nothing more to start
        request, fds = received
        if len(fds) != 2:
            for extra in fds:
                os.close(extra)
            replies.send({"error": f"expected 2 file descriptors, got {len(fds)}"})
            continue
        try:
            pid = _spawn(request, fds, server)
        except Exception as exc:  # noqa: BLE001  (a failed fork ends this request, never the template)
            replies.send({"error": f"fork failed: {exc}"})
            continue
        replies.send({"pid": pid})


def preload(specs: list[str]) -> None:
    """Import each `MODULE[:FUNCTION]` (and call FUNCTION), in order. Best effort: what fails to
    load here is loaded by each worker itself, as a fresh interpreter would."""
    for spec in specs:
        name, _, function = spec.partition(":")
        try:
            module = importlib.import_module(name)
            if function:
                getattr(module, function)()
        except Exception as exc:  # noqa: BLE001
            print(f"worker.forkserver: preload of {spec} skipped ({type(exc).__name__}: {exc})", file=sys.stderr)


def _arguments(argv: list[str]) -> tuple[int, list[str]] | None:
    """(FD, what to preload) from `FD [--preload MODULE[:FUNCTION]]...`, or None when malformed."""
    if not argv or not argv[0].isdigit():
        return None
    names, rest = [], argv[1:]
    while rest:
        if rest[0] != "--preload" or len(rest) < 2:
            return None
        names.append(rest[1])
        rest = rest[2:]
    return int(argv[0]), names


if __name__ == "__main__":
    parsed = _arguments(sys.argv[1:])
    if parsed is None:
        print("usage: python -m worker.forkserver FD [--preload MODULE[:FUNCTION]]...", file=sys.stderr)
        sys.exit(2)
    preload(parsed[1])
    warm_up()
    sys.exit(serve(parsed[0]))
