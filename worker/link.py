"""The worker's side of the control channel: reports, acknowledged requests, the kill plan.

A reader thread takes every message from the supervisor, so several threads (a UI
callback on the turn's thread, tools on pool threads) can each wait for their own
acknowledgement. If the supervisor goes away, waiting requests fail and the worker
stops: it has nobody left to tell what it shows.
"""
from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections import Counter
from typing import Any

from worker.ledger import quiescent
from worker.protocol import Channel, ChannelClosed, KillPlan


class SupervisorLink:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._seq = itertools.count(1)
        self._waiting: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.plan: KillPlan | None = None
        self.released = threading.Event()
        self.finished = False  # set once the outcome is sent; after that a closed channel is expected
        threading.Thread(target=self._read_loop, name="supervisor-link", daemon=True).start()

    def _read_loop(self) -> None:
        try:
            while True:
                message = self.channel.recv()
                kind = message.get("type")
                if kind == "ack":
                    with self._lock:
                        event = self._waiting.pop(int(message["seq"]), None)
                    if event is not None:
                        event.set()
                elif kind == "plan":
                    if message.get("kill_at"):
                        self.plan = KillPlan.parse(message["kill_at"], message.get("mode", "self"))
                elif kind == "continue":
                    self.released.set()
        except ChannelClosed:
            pass
        finally:
            self._closed.set()
            with self._lock:
                for event in self._waiting.values():
                    event.set()
                self._waiting.clear()
            if not self.finished:
                # The supervisor is gone (killed or exited): an unsupervised worker must not go on.
                os.kill(os.getpid(), signal.SIGKILL)

    def report(self, message: dict[str, Any]) -> None:
        self.channel.send(message)

    def report_last(self, message: dict[str, Any]) -> None:
        """Report `message` as this process's last word: no thread's report can follow it."""
        self.channel.send_last(message)

    def request(self, message: dict[str, Any]) -> None:
        """Send and wait until the supervisor acknowledges (it has recorded and checked it)."""
        seq = next(self._seq)
        event = threading.Event()
        with self._lock:
            if self._closed.is_set():
                raise ChannelClosed("supervisor is gone")
            self._waiting[seq] = event
        self.channel.send(dict(message, seq=seq))
        event.wait()
        if self._closed.is_set():
            raise ChannelClosed("supervisor went away before acknowledging")


class ProbeWiring:
    """The probe handler: count hits, report each, and die where the kill plan says."""

    def __init__(self, link: SupervisorLink | None, plan: KillPlan | None) -> None:
        self.link = link
        self.plan = plan
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, name: str, context: dict[str, Any]) -> None:
        with self._lock:
            self.counts[name] += 1
            occurrence = self.counts[name]
        plan = self.plan or (self.link.plan if self.link else None)
        kill = plan is not None and plan.probe == name and plan.occurrence == occurrence
        if self.link is not None:
            report = {"type": "probe", "name": name, "n": occurrence, "ctx": context, "kill": kill,
                      "mode": plan.mode if kill and plan else None}
            if kill and plan is not None and plan.mode == "pause":
                # Reported, the supervisor SIGSTOPs this worker until a replacement has taken the
                # turn over; no other thread may be frozen inside a write to the effects ledger.
                with quiescent():
                    self.link.report(report)
                    self.link.released.wait()
                return
            if kill and plan is not None and plan.mode == "interrupt":
                # Ctrl-C at this instant: the main thread's KeyboardInterrupt comes at its next
                # bytecode (here, when this is the main thread), and the worker goes on to answer
                # what it cut off, so this report is not its last word.
                self.link.report(report)
                os.kill(os.getpid(), signal.SIGINT)
                return
            # A kill's report is the process's last word, so the supervisor can tell the death it
            # announces from a later one (a tool killing its own worker): see checker.deaths.
            if kill:
                self.link.report_last(report)
            else:
                self.link.report(report)
        if not kill:
            return
        assert plan is not None
        if plan.mode == "external" and self.link is not None:
            # The supervisor kills us by pid; until then nothing else may happen.
            while True:
                time.sleep(3600)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # SIGKILL arrives before this returns
