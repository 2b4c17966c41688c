"""systemd's notify protocol: READY=1 once the loop runs, WATCHDOG=1 every WATCHDOG_USEC/2,
STOPPING=1 when the drain starts, over a unix datagram socket the test binds itself."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.daemon import inbox
from supervisor.daemon.systemd import Notifier

from daemon_helpers.harness import Daemons, env_for, wait_for  # isort: skip


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound unix datagram socket in a short private directory (a socket path must fit 108 bytes)."""
    folder = tempfile.mkdtemp(prefix="sd-")
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(30)
    try:
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def receive(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode("utf-8")
    return dict(line.split("=", 1) for line in data.split("\n") if "=" in line)


def test_the_notifier_speaks_the_protocol_or_nothing(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    quiet = Notifier({})
    assert not quiet.enabled and quiet.ready() is False and quiet.watchdog_interval is None
    assert Notifier({"NOTIFY_SOCKET": "vsock:2:1"}).enabled is False

    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
    assert notifier.watchdog_interval == 1.5
    assert notifier.ready("serving x\ny") and receive(sock) == {"READY": "1", "MAINPID": str(os.getpid()),
                                                                 "STATUS": "serving x y"}
    assert notifier.watchdog() and receive(sock) == {"WATCHDOG": "1"}
    assert notifier.stopping() and receive(sock) == {"STOPPING": "1"}
    notifier.close()
    # The watchdog is someone else's when WATCHDOG_PID names another process.
    assert Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "x"}).watchdog_interval is None
    gone = Notifier({"NOTIFY_SOCKET": path + ".missing"})
    assert gone.ready() is False and gone.errors == 1  # systemd gone: the daemon serves on


def test_the_abstract_namespace(notify_socket: tuple[socket.socket, str]) -> None:
    name = f"hermes-test-{os.getpid()}-{id(notify_socket)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(30)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).stopping("bye")
        assert receive(sock) == {"STOPPING": "1", "STATUS": "bye"}
    finally:
        sock.close()


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_daemon_says_ready_pings_the_watchdog_and_says_stopping(
        tmp_path: Path, daemons: Daemons, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    db = tmp_path / "state.db"
    env = env_for(tmp_path, NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
    daemon = daemons(db, "--workers", "1", env=env, wait_ready=False)
    ready = receive(sock)
    assert ready["READY"] == "1" and ready["MAINPID"] == str(daemon.pid) and "serving" in ready["STATUS"]
    assert inbox.read_status(db)["state"] == "running"  # the loop ran before READY was sent
    pings = [receive(sock) for _ in range(3)]
    assert pings == [{"WATCHDOG": "1"}] * 3

    children = daemon.note_children()  # the template at least, for the no-survivor check below
    assert children and all("NOTIFY_SOCKET" not in c.environ() and "WATCHDOG_USEC" not in c.environ()
                            for c in children)  # the notifications are the daemon's alone
    daemon.proc.send_signal(signal.SIGTERM)
    while True:  # watchdog pings go on while it drains; STOPPING comes first of all that is not one
        message = receive(sock)
        if message != {"WATCHDOG": "1"}:
            break
    assert message["STOPPING"] == "1"
    assert daemon.proc.wait(30) == 0
    wait_for("every process the daemon started to be gone", lambda: not daemon.survivors(), timeout=10)


def test_the_documented_unit_gives_the_daemon_descriptors_for_its_connections_and_workers() -> None:
    from supervisor.daemon.http.limits import MAX_CONNECTIONS, fd_limits
    from supervisor.daemon.systemd import LIMIT_NOFILE

    text = (Path(__file__).resolve().parents[1] / "docs" / "daemon.md").read_text(encoding="utf-8")
    unit = text.split("```ini\n", 1)[1].split("```", 1)[0]
    lines = unit.splitlines()
    assert f"LimitNOFILE={LIMIT_NOFILE}" in lines and lines.index("[Service]") < lines.index(f"LimitNOFILE={LIMIT_NOFILE}")
    assert "Type=notify" in lines and "RestartPreventExitStatus=2" in lines
    assert fd_limits(LIMIT_NOFILE, workers=64)[0] == MAX_CONNECTIONS  # the cap, not the descriptors, limits
    assert fd_limits(1024, workers=4)[0] < MAX_CONNECTIONS  # what systemd's default would leave
