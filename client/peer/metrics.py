"""Prometheus metrics of a running peer (`--metrics-port`), read from the live objects when Prometheus scrapes.

The collectors hold references to the objects the process runs anyway (a client's Volunteer and Trainer, the
coordinator's Broadcaster) and read their attributes at scrape time, so that nothing in the training or
scheduling loops has to count or report anything for the metrics. Attributes that other parts may not have yet
(a trainer-wide `retries` counter, `handoffs`) are read with defaults: such a figure is exported as 0 rather than
missing, so that dashboards and alerts can rely on every series being there.

A client exports its own links only (src is itself): Prometheus scrapes every peer, so the swarm's matrix is the
union, and no peer multiplies the series by the swarm's size. The coordinator has no link of its own and exports
the links of every record it reads. Its swarm view (peers, links, members' progress) is read by a small loop of
its own (`CoordinatorCollector.watch`), since the broadcaster keeps no records between its polls.

The HTTP server is prometheus_client's, a daemon thread: `serve_metrics` must run after the DHT has started,
because the DHT process is forked and a fork must not happen with threads about (docs/hivemind.md, pitfall 3).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import statistics
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hetswarm.client.peer.addresses import MetricsAddress
from hetswarm.client.peer.held_out import swarm_held_out
from hetswarm.protocol.errors import ConfigError, HetswarmError
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, LinkMeasurement, PeerRecord, Progress
from hetswarm.protocol.units import BITS_PER_MBIT, MS_PER_S

__all__ = ["ClientCollector", "CoordinatorCollector", "MetricsServer", "beside", "serve_metrics"]

logger = logging.getLogger(__name__)

PEER_STATES = ("joining", "ready", "training", "leaving")
_STEP_HISTORY = 8
"""Observations of a member's progress kept for the coordinator's measured step time (a sliding window)."""


class MetricsServer:
    """A fresh CollectorRegistry (one per process, so no library's default metrics creep in) served over HTTP."""

    def __init__(self, registry: CollectorRegistry, httpd: WSGIServer, thread: threading.Thread) -> None:
        self.registry, self._httpd, self._thread = registry, httpd, thread

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops serving and frees the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=timeout_s)


def serve_metrics(address: MetricsAddress) -> MetricsServer:
    """Starts serving an empty registry (collectors are registered once their objects exist); call it only after
    the DHT has started (module docstring).

    Raises:
        HetswarmError: the address cannot be bound (taken, or not an address of this machine).
    """
    registry = CollectorRegistry()
    try:
        httpd, thread = start_http_server(address.port, addr=address.host, registry=registry)
    except OSError as e:
        raise HetswarmError(f"cannot serve metrics on {address.host}:{address.port}: {e.strerror or e}; "
                            f"choose another --metrics-port or --metrics-host") from None
    server = MetricsServer(registry, httpd, thread)
    logger.info(f"Serving Prometheus metrics at {server.url}")
    return server


def beside(main: Callable[[asyncio.Event], Awaitable[None]], *loops: Callable[[asyncio.Event], Awaitable[None]]
           ) -> Callable[[asyncio.Event], Awaitable[None]]:
    """`main(stop)` with `loops` running as tasks beside it, cancelled when main returns: a failing loop (logged)
    never takes main down, as a TaskGroup would."""

    async def run(stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(loop(stop)) for loop in loops]
        try:
            await main(stop)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    try:
                        await task
                    except Exception:
                        logger.warning("A metrics loop failed", exc_info=True)

    return run


def _gauge(name: str, documentation: str, value: float | None, **labels: str) -> GaugeMetricFamily:
    """A gauge with one sample (none when value is None: a figure nobody has yet is absent, not 0)."""
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    if value is not None:
        family.add_metric(list(labels.values()), float(value))
    return family


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=float(value))


def _safely(build: Callable[[], list[Metric]], what: str) -> list[Metric]:
    """One section of a scrape; if the objects changed shape under us, the others are still served."""
    try:
        return build()
    except Exception:
        logger.warning(f"Could not read the {what} metrics", exc_info=True)
        return []


def _links(links: Iterable[tuple[str, str, LinkMeasurement]]) -> list[Metric]:
    latency = GaugeMetricFamily("hetswarm_link_latency_seconds", "Measured one-way latency from src to dst.",
                                labels=["src", "dst"])
    bandwidth = GaugeMetricFamily("hetswarm_link_bandwidth_bytes_per_second", "Measured bandwidth from src to dst.",
                                  labels=["src", "dst"])
    for src, dst, link in links:
        latency.add_metric([src, dst], link.latency_ms / MS_PER_S)
        bandwidth.add_metric([src, dst], link.bandwidth_mbps * BITS_PER_MBIT / 8)
    return [latency, bandwidth]


def _peers_by_state(states: Iterable[str]) -> Metric:
    counts = collections.Counter(states)
    family = GaugeMetricFamily("hetswarm_peers", "Peers in view, by the state their records give.", labels=["state"])
    for state in sorted(set(PEER_STATES) | set(counts)):
        family.add_metric([state], counts[state])
    return family


def _plan(assignment: Any) -> list[Metric]:
    """The plan in force, as this peer knows it (absent before the first one)."""
    if assignment is None:
        return [_gauge("hetswarm_assignment_version", "Version of the plan in force; 0 before the first.", 0)]
    return [
        _gauge("hetswarm_assignment_version", "Version of the plan in force; 0 before the first.", assignment.version),
        _gauge("hetswarm_predicted_step_seconds", "Step time the plan in force predicts.", assignment.predicted_step_s),
        _gauge("hetswarm_plan_stages", "Pipeline stages (D_PP) of the plan in force.", assignment.d_pp),
        _gauge("hetswarm_plan_pipelines", "Pipelines (D_DP) of the plan in force.", assignment.d_dp),
    ]


class ClientCollector(Collector):
    """A volunteer's figures: its last step (StepReport), the plan it follows, its links and its view of peers."""

    def __init__(self, volunteer: Any, trainer: Any | None = None) -> None:
        self.volunteer, self.trainer = volunteer, trainer

    def collect(self) -> Iterable[Metric]:
        yield from _safely(self._training, "training")
        yield from _safely(self._plan, "plan")
        yield from _safely(self._swarm, "swarm")

    def _count(self, name: str, report: Any) -> int:
        """A counter from the trainer if it keeps one for its whole life, else from the last step's report."""
        value = getattr(self.trainer, name, None)
        if not isinstance(value, int | float):
            value = getattr(report, name, 0)
        return value if isinstance(value, int | float) else 0

    def _training(self) -> list[Metric]:
        report = getattr(self.trainer, "last_report", None)
        figures = [
            _counter("hetswarm_step_retries", "Aborted step attempts, retried (a new stage worker counts from 0).",
                     self._count("retries", report)),
            _counter("hetswarm_replica_resyncs", "Times this replica's state was replaced by its stage group's.",
                     self._count("resyncs", report)),
            _counter("hetswarm_handoffs", "State hand-offs (a stage's weights moved to or from this peer).",
                     self._count("handoffs", report)),
        ]
        if report is None:
            return figures
        loss = getattr(report, "loss", None)
        return figures + [
            _gauge("hetswarm_step", "Last training step this peer completed.", report.step),
            _gauge("hetswarm_loss", "Mean loss of the last step (last-stage peers only).", loss),
            _gauge("hetswarm_tokens_per_second", "Tokens per second of the last step.", report.tokens_per_s),
            _gauge("hetswarm_step_compute_seconds", "Compute seconds of the last step.", report.compute_s),
            _gauge("hetswarm_step_wait_seconds", "Seconds the last step waited for neighbours and the all-reduce.",
                   report.wait_s),
            _gauge("hetswarm_measured_step_seconds", "Wall-clock seconds of the last step.", report.wall_s),
        ]

    def _plan(self) -> list[Metric]:
        follower = getattr(self.volunteer, "follower", None)
        assignment = getattr(follower, "current", None) or getattr(self.trainer, "assignment", None)
        figures = _plan(assignment)
        role = assignment.roles.get(self.volunteer.node.peer_id) if assignment is not None else None
        info = GaugeMetricFamily("hetswarm_role", "This peer's (stage, replica) in the plan; absent while a standby.",
                                 labels=["stage", "replica"])
        if role is not None:
            info.add_metric([str(role.stage), str(role.replica)], 1)
        return figures + [info]

    def _swarm(self) -> list[Metric]:
        me = self.volunteer.node.peer_id
        peers: dict[str, PeerRecord] = dict(getattr(self.volunteer, "peers", {}))
        links: dict[str, LinkMeasurement] = dict(getattr(self.volunteer, "links", {}))
        states = [record.state for record in peers.values()] + [self._my_state()]
        return [_peers_by_state(states), *_links((me, dst, link) for dst, link in sorted(links.items()))]

    def _my_state(self) -> str:
        """As the volunteer's record says it (Volunteer.record, which we do not call: it asks the DHT process)."""
        state = getattr(self.volunteer, "state", "joining")
        follower = getattr(self.volunteer, "follower", None)
        return "training" if state == "ready" and getattr(follower, "role", None) is not None else state


class CoordinatorCollector(Collector):
    """The coordinator's figures: the plan it publishes, and the swarm as the records it reads say (`watch`)."""

    def __init__(self, published: Callable[[], Assignment | None], records: SwarmRecords, *,
                 interval_s: float = 5.0) -> None:
        """`published`: the plan the coordinator publishes now (None before its first)."""
        if interval_s <= 0:
            raise ConfigError(f"interval_s must be positive, got {interval_s}")
        self.published, self.records, self.interval_s = published, records, interval_s
        self.peers: dict[str, PeerRecord] = {}
        self.progress: dict[str, Progress] = {}
        self._seen: dict[str, collections.deque[tuple[int, int, float]]] = {}
        """Member → (assignment version, step, updated_at) of its distinct Progress records, the newest last."""

    async def watch(self, stop: asyncio.Event) -> None:
        """Reads the peers' and progress records every interval_s until `stop` (each read under its deadline)."""
        while not stop.is_set():
            try:
                self.peers = await self.records.peers()
                self.progress = progress = await self.records.progress()
                self._remember(progress)
            except TimeoutError:
                logger.debug("Reading the swarm for the metrics timed out; keeping the last view")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)

    def _remember(self, progress: dict[str, Progress]) -> None:
        for peer, record in progress.items():
            seen = self._seen.setdefault(peer, collections.deque(maxlen=_STEP_HISTORY))
            if not seen or (record.assignment_version, record.step) > seen[-1][:2]:
                seen.append((record.assignment_version, record.step, record.updated_at))
        for gone in set(self._seen) - set(progress):
            del self._seen[gone]

    def collect(self) -> Iterable[Metric]:
        assignment = self.published()
        yield from _safely(lambda: _plan(assignment), "plan")
        yield from _safely(lambda: self._members(assignment), "progress")
        yield from _safely(self._swarm, "swarm")

    def _members(self, assignment: Any) -> list[Metric]:
        """The plan's members as their Progress records say: the furthest step, and the measured step time."""
        if assignment is None:
            return []
        progress = {p: r for p, r in dict(self.progress).items()
                    if p in assignment.roles and r.assignment_version == assignment.version}
        steps = [r.step for r in progress.values()]
        periods = []
        for peer in assignment.roles:
            window = [(step, at) for version, step, at in list(self._seen.get(peer, ())) if version == assignment.version]
            if len(window) >= 2 and window[-1][0] > window[0][0]:
                periods.append((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]))
        losses = [r.loss for r in progress.values() if r.loss is not None]
        held_out = swarm_held_out(assignment, progress)
        believed = held_out if held_out is not None and held_out.corroborated else None
        return [
            _gauge("hetswarm_step", "Furthest step a member of the plan reported.", max(steps, default=None)),
            _gauge("hetswarm_loss", "Mean loss the plan's last-stage members reported.",
                   statistics.fmean(losses) if losses else None),
            _gauge("hetswarm_held_out_loss", "Held-out loss of the plan's model that two or more pipelines agree on "
                   "(client/peer/held_out.py).", believed.loss if believed else None),
            _gauge("hetswarm_held_out_step", "The step after which that held-out loss was measured.",
                   believed.step if believed else None),
            _gauge("hetswarm_measured_step_seconds", "Median over the plan's members of their recent step period.",
                   statistics.median(periods) if periods else None),
        ]

    def _swarm(self) -> list[Metric]:
        peers = dict(self.peers)
        links = ((src, dst, link) for src, record in sorted(peers.items())
                 for dst, link in sorted(record.links.items()) if dst in peers)
        return [_peers_by_state(r.state for r in peers.values()), *_links(links)]
