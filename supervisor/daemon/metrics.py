"""What `GET /metrics` reports, in the Prometheus text format (through prometheus-client).

The daemon counts what only it sees (`DaemonMetrics`: plain integers, bumped in the daemon's
thread, read by the HTTP thread); the turns by state and the queue depth are read from the
database at each scrape. Counters start at 0 with each daemon process (Prometheus takes a
counter that goes down as a restart). prometheus-client is imported only when the HTTP API
builds its registry, so the daemon runs without it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from hermes.persistence_failure import CAUSES

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# A worker's outcome for a turn closed by a failed write says "<this>:<cause>" (hermes.turn).
FLUSH_FAILED_PREFIX = "session_persistence_failed:"
TURN_STATES = ("queued", "running", "done", "failed")


class DaemonMetrics:
    """Counters only the daemon sees, since it started."""

    def __init__(self) -> None:
        self.worker_restarts = 0          # workers started again for a turn their predecessor left unfinished
        self.crash_loops = 0              # crash loops found: K workers in a row without durable progress
        self.cancelled = 0                # turns ended 'failed' ("cancelled") by a cancel request
        self.flush_failures: Counter[str] = Counter()  # turns closed by a failed write, by cause

    def note_outcome(self, result: Any) -> None:
        """A worker's outcome message: count a turn closed by a failed write under its cause."""
        reason = result.get("failure_reason") if isinstance(result, dict) else None
        if isinstance(reason, str) and reason.startswith(FLUSH_FAILED_PREFIX):
            cause = reason[len(FLUSH_FAILED_PREFIX):] or "unknown"
            self.flush_failures[cause if cause in CAUSES else "unknown"] += 1


@dataclass(frozen=True)
class HttpGauges:
    """The HTTP API's own state at a scrape, taken on its event loop."""

    connections: int = 0              # open connections
    streams: int = 0                  # open event streams
    streams_waiting: int = 0          # of those, the ones waiting for their client to take a chunk
    stream_held_bytes: int = 0        # characters the streams read from the database and have not sent
    limits: dict[str, int] = field(default_factory=dict)  # connections and requests a limit acted on, by kind


def build_registry(turn_counts: Callable[[], dict[str, int]], daemon: Any,
                   http: Callable[[], HttpGauges]) -> CollectorRegistry:
    """A registry whose one collector reads `turn_counts()`, the daemon's counters and `http()` at each scrape.

    `daemon` is read, never written: its `metrics` (DaemonMetrics), `totals`, `leases` and `state`.
    """
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterator[Any]:
            counts = turn_counts()
            turns = GaugeMetricFamily("hermes_turns", "Turns in the database, by state.", labels=["state"])
            for state in TURN_STATES:
                turns.add_metric([state], counts.get(state, 0))
            yield turns
            yield GaugeMetricFamily("hermes_queue_depth", "Turns queued and not started yet.",
                                    value=counts.get("queued", 0))
            m: DaemonMetrics = daemon.metrics
            yield CounterMetricFamily("hermes_worker_restarts", "Workers started again for a turn a worker "
                                      "left unfinished (killed, crashed, timed out).", value=m.worker_restarts)
            yield CounterMetricFamily("hermes_worker_deaths", "Workers that exited with a non-zero status.",
                                      value=int(daemon.totals.get("worker_deaths", 0)))
            yield CounterMetricFamily("hermes_crash_loops", "Crash loops found: workers in a row that made no "
                                      "durable progress on their turn (which is then given up).", value=m.crash_loops)
            yield CounterMetricFamily("hermes_turns_given_up", "Turns the daemon ended 'failed' (crash loop, or a "
                                      "limit reached), cancels not counted.",
                                      value=int(daemon.totals.get("turns_given_up", 0)))
            yield CounterMetricFamily("hermes_turns_cancelled", "Turns ended by a cancel request.",
                                      value=m.cancelled)
            flush = CounterMetricFamily("hermes_flush_failures", "Turns closed by a failed write of their "
                                        "transcript, by cause.", labels=["cause"])
            for cause in CAUSES:
                flush.add_metric([cause], m.flush_failures.get(cause, 0))
            yield flush
            yield GaugeMetricFamily("hermes_workers_busy", "Workers running a turn now.", value=len(daemon.leases))
            gauges = http()
            yield GaugeMetricFamily("hermes_http_connections", "Open HTTP connections.", value=gauges.connections)
            yield GaugeMetricFamily("hermes_http_event_streams", "Open event streams.", value=gauges.streams)
            yield GaugeMetricFamily("hermes_http_event_streams_waiting", "Event streams waiting for their client "
                                    "to read what they sent (backpressure).", value=gauges.streams_waiting)
            yield GaugeMetricFamily("hermes_http_stream_held_bytes", "Event text the streams read from the "
                                    "database and have not handed to their connection yet.",
                                    value=gauges.stream_held_bytes)
            limits = CounterMetricFamily("hermes_http_limits", "Connections and requests the HTTP API's limits "
                                         "acted on (closed, refused, timed out), by kind.", labels=["kind"])
            for kind, count in sorted(gauges.limits.items()):
                limits.add_metric([kind], count)
            yield limits
            draining = GaugeMetricFamily("hermes_daemon_draining", "1 while the daemon drains.",
                                         value=1 if daemon.state != "running" else 0)
            yield draining

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    return registry
