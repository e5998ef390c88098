"""A volunteer's life in the swarm: publish its record on a heartbeat, watch who is there, measure its links.

Three loops share one event loop and die together (asyncio.TaskGroup): the heartbeat refreshes the PeerRecord
every T/2 with expiry T, so a silent peer disappears within T; the view reads everyone's records and wakes the
prober when a new peer appears; the prober measures links, a bounded number per round. With a pinned coordinator
a fourth loop follows its assignments (client/assignment_follower.py), publishes the role at once and hands each
newly accepted assignment to the training side through the `on_assignment` hook.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from hetswarm.client.peer.assignment_follower import AssignmentFollower
from hetswarm.client.peer.link_probe import ProbeConfig, ProbeServicer, measure_link
from hetswarm.client.peer.node import SwarmNode
from hetswarm.protocol.keys import probe_namespace, short_id
from hetswarm.protocol.records import Assignment, Hardware, LinkMeasurement, PeerRecord, PeerState
from hetswarm.protocol.errors import ConfigError

logger = logging.getLogger(__name__)

VERSION = importlib.metadata.version("hetswarm")


@dataclass(frozen=True, kw_only=True, slots=True)
class VolunteerConfig:
    ttl_s: float = 60.0
    """Record expiry T; the heartbeat refreshes every T/2."""
    view_interval_s: float = 5.0
    """How often the swarm's records are read."""
    reprobe_s: float = 600.0
    """Links are measured again after this long, and at once when a new peer appears."""
    max_probes_per_round: int = 8
    probe: ProbeConfig = ProbeConfig()
    public_name: str | None = None
    site: str | None = None
    coordinator: str | None = None
    """Peer id of the coordinator whose assignments this peer follows; None follows nobody."""
    assignment_poll_s: float = 2.0
    """How often the assignment key is read when following a coordinator."""

    def __post_init__(self) -> None:
        if self.assignment_poll_s <= 0:
            raise ConfigError(f"assignment_poll_s must be positive, got {self.assignment_poll_s}")
        if self.ttl_s < 2 or self.view_interval_s <= 0 or self.max_probes_per_round < 1:
            raise ConfigError(f"bad timing: ttl_s={self.ttl_s}, view_interval_s={self.view_interval_s}, "
                             f"max_probes_per_round={self.max_probes_per_round}")


OnAssignment = Callable[[Assignment], Awaitable[None]]


class Volunteer:
    """A peer's life in the swarm (module docstring).

    Args:
        on_assignment: awaited as a task with each newly accepted assignment of the pinned coordinator (never with
            an older or equal version); the poll loop does not wait for it. Its failures are logged; tasks still
            running when the volunteer stops are cancelled.
    """

    def __init__(self, node: SwarmNode, hardware: Hardware, config: VolunteerConfig, *,
                 on_assignment: OnAssignment | None = None):
        self.node, self.hardware, self.config = node, hardware, config
        self.follower = AssignmentFollower(config.coordinator, node.peer_id) if config.coordinator else None
        self._on_assignment = on_assignment
        self._hook_tasks: set[asyncio.Task] = set()
        self.state: PeerState = "joining"
        self.links: dict[str, LinkMeasurement] = {}
        self.peers: dict[str, PeerRecord] = {}
        self._probe_wanted = asyncio.Event()
        self._probe_wanted.set()  # the first round turns `joining` into `ready`, even with nobody to measure

    @property
    def namespace(self) -> str:
        return probe_namespace(self.node.config.swarm)

    def record(self) -> PeerRecord:
        role = self.follower.role if self.follower else None
        return PeerRecord(
            peer_id=self.node.peer_id,
            maddrs=[str(m) for m in self.node.dht.get_visible_maddrs()][:16],
            version=VERSION,
            hardware=self.hardware,
            links=dict(self.links),
            state="training" if self.state == "ready" and role is not None else self.state,
            public_name=self.config.public_name,
            site=self.config.site,
            assignment_version=self.follower.current.version if self.follower and self.follower.current else None,
            role=role,
            updated_at=get_dht_time(),
        )

    async def publish_record(self) -> None:
        try:
            stored = await self.node.records.publish(self.record(), ttl_s=self.config.ttl_s)
        except TimeoutError:
            stored = False
        if not stored:
            logger.warning("No DHT node accepted our peer record; retrying at the next heartbeat")

    async def run(self, stop: asyncio.Event) -> None:
        """Serves until `stop` is set, then publishes `leaving` once."""
        await ProbeServicer().add_p2p_handlers(self.node.p2p, namespace=self.namespace)
        await self.publish_record()
        try:
            async with asyncio.TaskGroup() as tasks:
                loops = [self._heartbeat, self._watch, self._probe] + ([self._follow] if self.follower else [])
                running = [tasks.create_task(loop()) for loop in loops]
                await stop.wait()
                for task in running + list(self._hook_tasks):
                    task.cancel()
        finally:
            self.state = "leaving"
            await self.publish_record()
            logger.info("Published `leaving`; goodbye")

    async def _follow(self) -> None:
        """Polls the assignment key; a newly accepted plan is published in our record and handed to the hook."""
        while True:
            try:
                entries = await self.node.records.assignments()
            except TimeoutError:
                logger.debug("Reading the assignment key timed out")
                entries = {}
            if (accepted := self.follower.consider(entries)) is not None:
                await self.publish_record()
                if self._on_assignment is not None:
                    task = asyncio.create_task(self._on_assignment(accepted), name=f"assignment-v{accepted.version}")
                    self._hook_tasks.add(task)
                    task.add_done_callback(self._hook_done)
            await asyncio.sleep(self.config.assignment_poll_s)

    def _hook_done(self, task: asyncio.Task) -> None:
        self._hook_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(f"on_assignment failed for {task.get_name()}", exc_info=task.exception())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.ttl_s / 2)
            await self.publish_record()

    async def _watch(self) -> None:
        while True:
            try:
                peers = await self.node.records.peers()
            except TimeoutError:
                logger.debug("Reading the swarm's peer records timed out; trying again")
                await asyncio.sleep(self.config.view_interval_s)
                continue
            peers.pop(self.node.peer_id, None)
            active = {p: r for p, r in peers.items() if r.state != "leaving"}
            new = set(active) - set(self.peers)
            self.peers = active
            self.node.sites.update({p: r.site for p, r in peers.items() if r.site is not None})
            if new:
                logger.info(f"{len(new)} new peer(s); {len(self.peers)} in view")
                self._probe_wanted.set()
            await asyncio.sleep(self.config.view_interval_s)

    def _due_for_probe(self) -> list[str]:
        """Unmeasured peers first, then the stalest measurements, at most max_probes_per_round.

        Each pair is measured by its peer with the smaller id: half the probe traffic, and no probe's pings wait
        behind the other side's payload on the same link. Links count as symmetric, as the paper's model has them.
        """
        now = get_dht_time()
        mine = [p for p in self.peers if p > self.node.peer_id]
        due = [p for p in mine if p not in self.links or now - self.links[p].measured_at > self.config.reprobe_s]
        due.sort(key=lambda p: self.links[p].measured_at if p in self.links else -1.0)
        return due[: self.config.max_probes_per_round]

    async def _probe(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._probe_wanted.wait(), timeout=self.config.reprobe_s)
            except TimeoutError:
                pass
            self._probe_wanted.clear()
            for peer in self._due_for_probe():
                try:
                    link = await measure_link(self.node.p2p, PeerID.from_base58(peer), namespace=self.namespace,
                                              config=self.config.probe)
                except Exception as e:  # a dead or misbehaving peer costs one probe, never the client
                    logger.debug(f"Probe of {peer} failed: {e!r}", exc_info=True)
                    continue
                self.links[peer] = link
                logger.info(f"Link to {short_id(peer)}: {link.latency_ms:.1f} ms, {link.bandwidth_mbps:.1f} Mbit/s")
            self.links = {p: m for p, m in self.links.items() if p in self.peers}
            if self.state == "joining":
                self.state = "ready"
            await self.publish_record()
            if self._due_for_probe():
                self._probe_wanted.set()
